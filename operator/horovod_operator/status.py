"""Pure status logic: the job and what exists of it in, the new status out.

:func:`compute_status` is the whole state machine of a HorovodJob. It reads
the previous status (for the restart count, the start time and the condition
transition times, the only things not observable from the children) and the
children, and returns the next status. The reconciler then acts on it: creates
what is missing in Pending/Starting/Running, deletes pods in Restarting,
Suspended and on finish. Status is derived, not accumulated, so an operator
restarted at any point computes the same status from the same cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from horovod_worker import contract

from . import names
from .api import (
    TERMINAL_PHASES,
    Condition,
    Failure,
    HorovodJob,
    HorovodJobStatus,
    LauncherStatus,
    Phase,
    WorkerCounts,
)

Obj = Mapping[str, Any]

# Condition types.
CREATED: Final = "Created"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
SPEC_REJECTED: Final = "SpecRejected"

# Reasons.
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_WORKER_FAILED: Final = "WorkerFailed"
REASON_LAUNCHER_FAILED: Final = "LauncherFailed"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_SUCCEEDED: Final = "LauncherSucceeded"
REASON_CREATED: Final = "ChildrenCreated"
REASON_LAUNCHER_RUNNING: Final = "LauncherRunning"
REASON_WAITING: Final = "WaitingForWorkers"
REASON_SUSPENDED: Final = "JobSuspended"
REASON_RESUMED: Final = "JobResumed"
REASON_REPLICAS_IMMUTABLE: Final = "ReplicasImmutable"

# The condition that each phase sets True; the others among them go False.
_PHASE_CONDITION: Final[dict[str, str]] = {
    "Running": RUNNING,
    "Restarting": RESTARTING,
    "Suspended": SUSPENDED,
    "Succeeded": SUCCEEDED,
    "Failed": FAILED,
}
_TRANSIENT_CONDITIONS: Final = (RUNNING, RESTARTING, SUSPENDED)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """Conditions with `type_` set; lastTransitionTime moves only when status changes."""
    value: Literal["True", "False"] = "True" if status else "False"
    result = []
    found = False
    for condition in conditions:
        if condition.type != type_:
            result.append(condition)
            continue
        found = True
        moved = condition.status != value
        result.append(
            Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=format_time(now) if moved else condition.last_transition_time,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=format_time(now),
            )
        )
    return result


def _condition(status: HorovodJobStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def _enter_phase(
    status: HorovodJobStatus, phase: Phase, reason: str, message: str, now: datetime
) -> None:
    """Set phase and its condition True; the other transient conditions go False."""
    status.phase = phase
    conditions = status.conditions
    own = _PHASE_CONDITION.get(phase)
    for type_ in _TRANSIENT_CONDITIONS:
        if type_ != own and _condition(status, type_) is not None:
            current = _condition(status, type_)
            assert current is not None
            if current.status == "True":
                conditions = set_condition(conditions, type_, False, reason, message, now)
    if own is not None:
        conditions = set_condition(conditions, own, True, reason, message, now)
    status.conditions = conditions


# --- reading pods and the launcher Job ---------------------------------------------------


def labels_of(obj: Obj) -> Mapping[str, str]:
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


def attempt_of(obj: Obj) -> int | None:
    value = labels_of(obj).get(names.LABEL_ATTEMPT)
    return int(value) if value is not None and value.isdigit() else None


def role_of(obj: Obj) -> str | None:
    return labels_of(obj).get(names.LABEL_ROLE)


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def is_terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_ready(pod: Obj) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def pod_failures(pod: Obj) -> list[Failure]:
    """Why a failed pod failed: each container that exited non-zero, or the pod reason."""
    status = pod.get("status") or {}
    pod_reason = status.get("reason")
    failures = []
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            failures.append(
                Failure(
                    pod=name_of(pod),
                    container=container.get("name"),
                    exit_code=terminated.get("exitCode"),
                    reason=pod_reason or terminated.get("reason") or "Error",
                    message=_tail(terminated.get("message")),
                )
            )
    if not failures:
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        failures.append(
            Failure(
                pod=name_of(pod),
                container=containers[0].get("name"),
                exit_code=None,
                reason=pod_reason or "Error",
            )
        )
    return failures


MESSAGE_LIMIT: Final = 2048


def _tail(message: str | None) -> str | None:
    """The end of a termination message (the kubelet already caps it; the API may not)."""
    if not message:
        return None
    return message[-MESSAGE_LIMIT:]


def exit_code(pod: Obj) -> int | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            code = terminated.get("exitCode")
            return int(code) if code is not None else None
    return None


def job_condition(batch_job: Obj | None, type_: str) -> bool:
    if batch_job is None:
        return False
    for condition in (batch_job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return True
    return False


def current_pods(pods: Iterable[Obj], role: str, attempt: int) -> list[Obj]:
    """Pods of this attempt and role that are not on their way out, by name."""
    selected = [
        pod
        for pod in pods
        if role_of(pod) == role and attempt_of(pod) == attempt and not is_terminating(pod)
    ]
    return sorted(selected, key=name_of)


def stale_children(pods: Iterable[Obj], launcher_job: Obj | None, attempt: int) -> list[str]:
    """Names of worker pods and launcher Job that block the next attempt.

    Worker pods and the launcher Job have fixed names, so a new attempt can only
    start once the old ones are gone (terminating ones included).
    """
    blocking = [
        name_of(pod)
        for pod in pods
        if role_of(pod) == contract.ROLE_WORKER
        and (attempt_of(pod) != attempt or is_terminating(pod))
    ]
    if launcher_job is not None and (
        attempt_of(launcher_job) != attempt or is_terminating(launcher_job)
    ):
        blocking.append(name_of(launcher_job))
    return blocking


def launcher_state(
    pods: Iterable[Obj], launcher_job: Obj | None, attempt: int
) -> LauncherStatus | None:
    """The launcher of this attempt: its newest pod, completed by the Job's conditions."""
    if launcher_job is None or attempt_of(launcher_job) != attempt:
        return None
    launchers = [
        pod for pod in pods if role_of(pod) == contract.ROLE_LAUNCHER and attempt_of(pod) == attempt
    ]
    launchers.sort(key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    state = LauncherStatus(phase="Pending")
    if launchers:
        newest = launchers[-1]
        state = LauncherStatus(
            phase=pod_phase(newest), pod_name=name_of(newest), exit_code=exit_code(newest)
        )
    if job_condition(launcher_job, "Complete"):
        state.phase = "Succeeded"
    elif job_condition(launcher_job, "Failed") and state.phase != "Succeeded":
        state.phase = "Failed"
    return state


def _failure_message(failures: list[Failure]) -> str:
    parts = []
    for failure in failures:
        detail = [failure.reason or "Error"]
        if failure.exit_code is not None:
            detail.append(f"exit code {failure.exit_code}")
        container = f" container {failure.container}" if failure.container else ""
        parts.append(f"pod {failure.pod}{container} failed ({', '.join(detail)})")
    return "; ".join(parts)


# --- the state machine -------------------------------------------------------------------


def active_replicas(job: HorovodJob) -> int:
    """The worker count the job runs with.

    Once pods exist the count is fixed (status.workers.replicas): changing it on
    a running job is rejected (elastic scaling is not supported yet). A suspended
    or not yet started job takes the spec's count.
    """
    status = job.status
    if (
        status is not None
        and status.workers is not None
        and status.workers.replicas
        and status.phase in ("Pending", "Starting", "Running", "Restarting")
    ):
        return status.workers.replicas
    return job.spec.worker.replicas


def invalid_spec_status(
    previous: HorovodJobStatus | None, message: str, generation: int, now: datetime
) -> HorovodJobStatus:
    """Failed/InvalidSpec: the job never runs until its spec is fixed."""
    status = (previous or HorovodJobStatus()).model_copy(deep=True)
    status.observed_generation = generation
    if status.phase != "Failed":
        status.completion_time = format_time(now)
    _enter_phase(status, "Failed", REASON_INVALID_SPEC, message, now)
    return status


def compute_status(
    job: HorovodJob,
    pods: Iterable[Obj],
    launcher_job: Obj | None,
    now: datetime,
) -> HorovodJobStatus:
    """The next status of `job` given its pods (workers and launcher) and launcher Job."""
    pods = list(pods)
    previous = job.status or HorovodJobStatus()
    status = previous.model_copy(deep=True)
    policy = job.spec.run_policy

    # A finished job is final; its pods being cleaned up must not change it.
    if previous.phase in TERMINAL_PHASES:
        return status
    status.observed_generation = job.metadata.generation

    attempt = previous.restarts
    replicas = active_replicas(job)
    workers = current_pods(pods, contract.ROLE_WORKER, attempt)
    status.workers = _count_workers(workers, replicas)

    if replicas != job.spec.worker.replicas:
        status.conditions = set_condition(
            status.conditions,
            SPEC_REJECTED,
            True,
            REASON_REPLICAS_IMMUTABLE,
            f"worker.replicas cannot change on a running job ({replicas} -> "
            f"{job.spec.worker.replicas}); elastic scaling is not supported yet. "
            f"The job keeps {replicas} workers; suspend it or recreate it to change the count",
            now,
        )
    elif _condition(status, SPEC_REJECTED) is not None:
        status.conditions = set_condition(
            status.conditions, SPEC_REJECTED, False, "SpecAccepted", "", now
        )

    if policy.suspend:
        status.launcher = None
        status.workers = _count_workers(workers, job.spec.worker.replicas)
        _enter_phase(status, "Suspended", REASON_SUSPENDED, "the job is suspended", now)
        return status
    if previous.phase == "Suspended":
        # Resumed: the deadline counts from the resumption, as for batch/v1 Jobs.
        status.start_time = format_time(now)
        status.conditions = set_condition(
            status.conditions, SUSPENDED, False, REASON_RESUMED, "the job is resumed", now
        )
        status.workers = _count_workers(workers, job.spec.worker.replicas)
        status.phase = "Pending"

    if status.start_time is None:
        status.start_time = format_time(now)

    deadline = policy.active_deadline_seconds
    if deadline is not None and now >= parse_time(status.start_time) + timedelta(seconds=deadline):
        status.completion_time = format_time(now)
        _enter_phase(
            status,
            "Failed",
            REASON_DEADLINE,
            f"the job ran longer than activeDeadlineSeconds ({deadline}s)",
            now,
        )
        return status

    if previous.phase == "Restarting":
        blocking = stale_children(pods, launcher_job, attempt)
        if blocking:
            return status
        status.phase = "Pending"
        status.conditions = set_condition(
            status.conditions,
            RESTARTING,
            False,
            "Restarted",
            f"attempt {attempt} is starting",
            now,
        )

    launcher = launcher_state(pods, launcher_job, attempt)
    status.launcher = launcher

    failed_workers = [pod for pod in workers if pod_phase(pod) == "Failed"]
    launcher_failed = launcher is not None and launcher.phase == "Failed"
    if failed_workers or launcher_failed:
        failures = [f for pod in failed_workers for f in pod_failures(pod)]
        reason = REASON_WORKER_FAILED if failed_workers else REASON_LAUNCHER_FAILED
        if launcher_failed:
            failures += _launcher_failures(pods, launcher, attempt)
        status.failures = failures
        message = _failure_message(failures)
        if status.restarts < policy.backoff_limit:
            status.restarts += 1
            status.launcher = None
            _enter_phase(
                status,
                "Restarting",
                reason,
                f"{message}; restart {status.restarts} of {policy.backoff_limit}",
                now,
            )
        else:
            status.completion_time = format_time(now)
            _enter_phase(
                status,
                "Failed",
                reason,
                f"{message}; backoffLimit ({policy.backoff_limit}) reached",
                now,
            )
        return status

    if launcher is not None and launcher.phase == "Succeeded":
        status.completion_time = format_time(now)
        _enter_phase(
            status, "Succeeded", REASON_SUCCEEDED, "the launcher completed successfully", now
        )
        return status

    counts = status.workers
    if len(workers) == replicas:
        status.conditions = set_condition(
            status.conditions,
            CREATED,
            True,
            REASON_CREATED,
            f"{replicas} worker pod(s) and the launcher's objects are created",
            now,
        )
    if launcher is not None and launcher.phase == "Running":
        _enter_phase(status, "Running", REASON_LAUNCHER_RUNNING, "the launcher is running", now)
    elif counts.running == replicas:
        status.phase = "Starting"
    else:
        status.phase = "Pending"
    return status


def _launcher_failures(
    pods: Iterable[Obj], launcher: LauncherStatus | None, attempt: int
) -> list[Failure]:
    for pod in pods:
        if (
            launcher is not None
            and name_of(pod) == launcher.pod_name
            and role_of(pod) == contract.ROLE_LAUNCHER
            and attempt_of(pod) == attempt
            and pod_phase(pod) == "Failed"
        ):
            return pod_failures(pod)
    name = launcher.pod_name if launcher and launcher.pod_name else "launcher"
    code = launcher.exit_code if launcher else None
    return [Failure(pod=name, container=contract.ROLE_LAUNCHER, exit_code=code, reason="Error")]


def _count_workers(workers: list[Obj], replicas: int) -> WorkerCounts:
    phases = [pod_phase(pod) for pod in workers]
    ready = sum(1 for pod in workers if pod_phase(pod) == "Running" and pod_ready(pod))
    return WorkerCounts(
        replicas=replicas,
        ready=ready,
        running=phases.count("Running"),
        succeeded=phases.count("Succeeded"),
        failed=phases.count("Failed"),
        summary=f"{ready}/{replicas}",
    )


def all_workers_ready(status: HorovodJobStatus) -> bool:
    counts = status.workers
    return counts is not None and counts.replicas > 0 and counts.ready == counts.replicas


# How far a start has got: worker counters, the launcher's own phase, Pending ->
# Starting and the Created condition. The reconciler may hold a change of these
# alone for a moment, since a later change (Running, a failure) often supersedes it.
PROGRESS_PHASES: Final = frozenset({"Pending", "Starting"})
_PROGRESS_KEYS: Final = frozenset({"workers", "launcher", "phase", "conditions"})


def progress_only(stored: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when two status bodies (as status_body makes them) differ only in progress.

    A first status (nothing stored) and every change of phase other than Pending
    <-> Starting, of any condition but Created, of restarts, failures or times are
    not progress: users and the operator's own next step wait for those.
    """
    if not stored:
        return False
    phases = {stored.get("phase"), new.get("phase")}
    if len(phases) > 1 and not phases <= PROGRESS_PHASES:
        return False
    for key in set(stored) | set(new):
        if stored.get(key) == new.get(key):
            continue
        if key not in _PROGRESS_KEYS:
            return False
        if key == "conditions" and _other_conditions(stored) != _other_conditions(new):
            return False
    return True


def _other_conditions(status: Mapping[str, Any]) -> list[Any]:
    return [c for c in status.get("conditions") or () if c.get("type") != CREATED]


def status_body(status: HorovodJobStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase, no nulls)."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def normalize_status(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored status in the same form as status_body, to compare them."""
    if not raw:
        return {}
    try:
        return status_body(HorovodJobStatus.model_validate(dict(raw)))
    except ValueError:
        return dict(raw)


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
