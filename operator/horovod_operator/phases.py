"""The phase machine: the job and its own children in, the next status out.

:func:`compute_status` reads the previous status only for what the children
cannot tell (the restart count, the start times, when conditions moved) and
derives the rest, so an operator restarted at any point computes the same
status from the same cluster. What the status means for the children (create,
delete, clean up) is decided in :mod:`horovod_operator.decide`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from . import names
from .api import (
    ATTEMPT_PHASES,
    STARTED_PHASES,
    TERMINAL_PHASES,
    Failure,
    HorovodJob,
    HorovodJobStatus,
    LauncherStatus,
    WorkerCounts,
)
from .children import (
    Children,
    attempt_of,
    current_workers,
    deleted_workers,
    disruption_of,
    finished_at,
    launcher_failures,
    launcher_state,
    name_of,
    pod_failures,
    pod_phase,
    pod_ready,
    stale_children,
)
from .conditions import (
    CREATED,
    REASON_CREATED,
    REASON_DEADLINE,
    REASON_FAIL_JOB,
    REASON_HUNG,
    REASON_INVALID_SPEC,
    REASON_LAUNCHER_DELETED,
    REASON_LAUNCHER_FAILED,
    REASON_LAUNCHER_RUNNING,
    REASON_POD_DELETED,
    REASON_REPLICAS_IMMUTABLE,
    REASON_RESTARTED,
    REASON_RESUMED,
    REASON_SECRET_DELETED,
    REASON_SPEC_ACCEPTED,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    REASON_WORKER_FAILED,
    REASON_WRONG_WORLD_SIZE,
    RESTARTING,
    SPEC_REJECTED,
    SUSPENDED,
    clear_condition,
    enter_phase,
    format_time,
    parse_time,
    set_condition,
)
from .failures import Judged, judge, outcome

# Phases of an attempt under way (its pods exist or are being made).
_ATTEMPT_PHASES: Final = frozenset({"Pending", "Starting", "Running", "Restarting"})

# status.failures keeps this many (the first to fail first); the message names fewer.
MAX_FAILURES: Final = 10
MAX_NAMED: Final = 3


def due_time(start: str | None, seconds: int | None) -> datetime | None:
    """start + seconds, or None when either is unset. The API bounds both (a year
    at most), so this never leaves datetime's range."""
    if start is None or seconds is None:
        return None
    return parse_time(start) + timedelta(seconds=seconds)


def active_replicas(job: HorovodJob) -> int:
    """The worker count the job runs with.

    Once a job started the count is fixed (status.workers.replicas): the CRD
    refuses a change, and where it cannot (an older CRD) the change is rejected
    with SpecRejected. A suspended or not yet started job takes the spec's count.
    An elastic job keeps maxReplicas pods (spec.worker_count()).
    """
    status = job.status
    if (
        status is not None
        and status.workers is not None
        and status.workers.replicas
        and status.phase in STARTED_PHASES
    ):
        return status.workers.replicas
    return job.spec.worker_count()


def invalid_spec_status(
    previous: HorovodJobStatus | None, message: str, generation: int, now: datetime
) -> HorovodJobStatus:
    """Failed/InvalidSpec: the job never runs until its spec is fixed."""
    status = (previous or HorovodJobStatus()).model_copy(deep=True)
    status.observed_generation = generation
    if status.phase != "Failed":
        status.completion_time = format_time(now)
    enter_phase(status, "Failed", REASON_INVALID_SPEC, message, now)
    return status


def fail(status: HorovodJobStatus, reason: str, message: str, now: datetime) -> HorovodJobStatus:
    status.completion_time = format_time(now)
    enter_phase(status, "Failed", reason, message, now)
    return status


def compute_status(
    job: HorovodJob,
    children: Children,
    now: datetime,
    rejected_edit: str | None = None,
    hold: tuple[str, str] | None = None,
) -> HorovodJobStatus:
    """The next status of `job` given its own children.

    `rejected_edit` is the message of an edit the job ignores (its spec failed
    validation after the job started; `job` then carries the last accepted spec).
    `hold` is (reason, message) of a job that Kueue has not admitted (queueing.py):
    it is Suspended like a job with runPolicy.suspend. An attempt that was under
    way when the hold came (an eviction) ends there, and the next one is counted
    as a restart that is not a failure.
    """
    previous = job.status or HorovodJobStatus()
    status = previous.model_copy(deep=True)
    policy = job.spec.run_policy

    # A finished job is final; its pods being cleaned up must not change it.
    if previous.phase in TERMINAL_PHASES:
        return status
    if rejected_edit is None:
        status.observed_generation = job.metadata.generation

    attempt = previous.restarts
    replicas = active_replicas(job)
    workers = current_workers(children, attempt)
    status.workers = count_workers(workers, replicas)
    _spec_rejection(status, job, replicas, rejected_edit, now)

    if policy.suspend or hold is not None:
        reason, message = REASON_SUSPENDED, "the job is suspended"
        if hold is not None and not policy.suspend:
            reason, message = hold
            if previous.phase in _ATTEMPT_PHASES:
                status.restarts += 1
                status.uncounted_restarts += 1
        status.launcher = None
        status.workers = count_workers(
            current_workers(children, status.restarts), job.spec.worker_count()
        )
        enter_phase(status, "Suspended", reason, message, now)
        return status
    if previous.phase == "Suspended":
        # Resumed: the deadline counts from the resumption, as for batch/v1 Jobs.
        status.start_time = status.attempt_start_time = format_time(now)
        status.conditions = set_condition(
            status.conditions, SUSPENDED, False, REASON_RESUMED, "the job is resumed", now
        )
        status.workers = count_workers(workers, job.spec.worker_count())
        status.phase = "Pending"

    if status.start_time is None:
        status.start_time = format_time(now)
    if status.attempt_start_time is None:
        status.attempt_start_time = status.start_time

    deadline = policy.active_deadline_seconds
    due = due_time(status.start_time, deadline)
    if due is not None and now >= due:
        return fail(
            status,
            REASON_DEADLINE,
            f"the job ran longer than activeDeadlineSeconds ({deadline}s)",
            now,
        )

    if previous.phase == "Restarting":
        if stale_children(children, attempt):
            return status
        status.phase = "Pending"
        status.attempt_start_time = format_time(now)
        status.conditions = set_condition(
            status.conditions, RESTARTING, False, REASON_RESTARTED, f"attempt {attempt} starts", now
        )

    launcher = launcher_state(children, attempt)
    status.launcher = launcher
    gloo = job.spec.launch_mode == "gloo"
    judged, reason = _judge_failures(job, previous, children, workers, launcher, attempt)
    if judged:
        return _failed_attempt(status, judged, reason, policy.backoff_limit, now)
    progress = previous.progress
    if progress is not None and progress.attempt == attempt and previous.phase == "Running":
        wrong = wrong_world_size(job, progress.world_size)
        if wrong is not None:
            return fail(status, REASON_WRONG_WORLD_SIZE, wrong, now)
        if progress.hung is not None:
            action = policy.progress_deadline_action
            why = f"runPolicy.progressDeadlineAction ({action})"
            message = progress.hung.message
            hung = [
                Judged(Failure(pod=pod, reason=REASON_HUNG, message=message), action, why)
                for pod in progress.hung.pods or [name_of_rank0(job, previous)]
            ]
            return _failed_attempt(status, hung, REASON_HUNG, policy.backoff_limit, now, message)

    done = succeeded(job, launcher, status.workers)
    if done is not None:
        status.completion_time = format_time(now)
        enter_phase(status, "Succeeded", REASON_SUCCEEDED, done, now)
        return status

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
        enter_phase(status, "Running", REASON_LAUNCHER_RUNNING, "the launcher is running", now)
    elif gloo and launcher is not None and launcher.phase == "Succeeded":
        # Its rendezvous is over (every worker reported); the pods say how it ended.
        enter_phase(
            status,
            "Running",
            REASON_LAUNCHER_RUNNING,
            "the launcher's rendezvous is over; waiting for the worker pods to end",
            now,
        )
    elif status.workers.running >= (job.spec.worker.replicas if job.spec.elastic else replicas):
        status.phase = "Starting"
    else:
        status.phase = "Pending"
    return status


def succeeded(
    job: HorovodJob, launcher: LauncherStatus | None, workers: WorkerCounts
) -> str | None:
    """Why the attempt succeeded, or None while it has not.

    mpi: horovodrun's exit is the result (the workers only run sshd). gloo: every
    worker pod exits with its own ranks' result, and the kubelet reports it; the
    launcher only serves the rendezvous, and its workers' reports to it (what
    ends it) are best effort. A failure is read from the pods in both modes.
    elastic: workers come and go, and Horovod's driver in the launcher knows how
    the training ended: the launcher's exit is the result, as in mpi mode.
    """
    if job.spec.launch_mode == "gloo" and not job.spec.elastic:
        if workers.replicas and workers.succeeded == workers.replicas:
            return f"every worker pod ({workers.replicas}) completed successfully"
        return None
    if launcher is not None and launcher.phase == "Succeeded":
        return "the launcher completed successfully"
    return None


def _spec_rejection(
    status: HorovodJobStatus,
    job: HorovodJob,
    replicas: int,
    rejected_edit: str | None,
    now: datetime,
) -> None:
    if rejected_edit is not None:
        status.conditions = set_condition(
            status.conditions, SPEC_REJECTED, True, REASON_INVALID_SPEC, rejected_edit, now
        )
    elif replicas != job.spec.worker_count():
        status.conditions = set_condition(
            status.conditions,
            SPEC_REJECTED,
            True,
            REASON_REPLICAS_IMMUTABLE,
            f"worker.replicas cannot change on a started job ({replicas} -> "
            f"{job.spec.worker_count()}); an elastic job (spec.elastic) changes its size "
            f"by itself. The job keeps {replicas} workers; suspend it or recreate it to "
            "change the count",
            now,
        )
    else:
        clear_condition(status, SPEC_REJECTED, REASON_SPEC_ACCEPTED, now)


def _launcher_vanished(previous: HorovodJobStatus, children: Children, attempt: int) -> bool:
    """The launcher Job of this attempt was seen (or its pods still are) and is gone.

    Only the operator deletes it on purpose, and only after leaving the attempt
    (Restarting, Suspended, finished), so here someone else did: the attempt has
    lost its launcher. Its pods may still run; they are deleted before another
    launcher starts.
    """
    if previous.launcher is not None and previous.phase in ("Starting", "Running"):
        return True
    return any(attempt_of(pod) == attempt for pod in children.stray_launcher_pods)


def _deleted_launcher(previous: HorovodJobStatus, children: Children) -> Failure:
    pods = [*children.stray_launcher_pods, *children.launcher_pods]
    name = (previous.launcher.pod_name if previous.launcher else None) or (
        str(pods[0]["metadata"]["name"]) if pods else "launcher"
    )
    return Failure(
        pod=name,
        container="launcher",
        reason=REASON_LAUNCHER_DELETED,
        message="the launcher Job was deleted while the attempt ran",
    )


def _judge_failures(
    job: HorovodJob,
    previous: HorovodJobStatus,
    children: Children,
    workers: list[Mapping[str, Any]],
    launcher: LauncherStatus | None,
    attempt: int,
) -> tuple[list[Judged], str]:
    """Every failure of the attempt, judged; and the reason to report."""
    rules = job.spec.run_policy.pod_failure_policy
    judged: list[Judged] = []
    reason = REASON_WORKER_FAILED
    elastic = job.spec.elastic is not None
    # The first to fail first: with many ranks failing together, the one that failed
    # first is the likeliest cause (the others lost a peer), and it is always kept.
    failed = [pod for pod in workers if pod_phase(pod) == "Failed"] if not elastic else []
    for pod in sorted(failed, key=finished_at):
        judged += [judge(pod, f, disruption_of(pod), rules) for f in pod_failures(pod)]
    # An elastic job goes on without a lost worker (decide.py replaces it).
    if previous.phase in ("Starting", "Running") and not elastic:
        # Every worker existed; one deleted or gone since was not deleted by us.
        present = {name_of(pod) for pod in children.workers if attempt_of(pod) == attempt}
        for pod in deleted_workers(children, attempt):
            gone = Failure(
                pod=name_of(pod),
                container=names.WORKER_CONTAINER,
                reason=REASON_POD_DELETED,
                message="the pod was deleted while the attempt ran",
            )
            judged.append(judge(pod, gone, disruption_of(pod) or REASON_POD_DELETED, rules))
        for index in range(active_replicas(job)):
            name = names.worker_name(job.metadata.name, index)
            if name not in present:
                gone = Failure(
                    pod=name,
                    container=names.WORKER_CONTAINER,
                    reason=REASON_POD_DELETED,
                    message="the pod disappeared while the attempt ran",
                )
                judged.append(judge(None, gone, REASON_POD_DELETED, rules))
    if _secret_lost(job, previous, children, attempt):
        # A new Secret would hold a new key the running workers' sshd does not know
        # (nor would their mounted copy change at once): the attempt starts over with
        # one key, and this disruption does not count.
        lost = Failure(
            pod=names.secret_name(job.metadata.name),
            reason=REASON_SECRET_DELETED,
            message="the job's SSH Secret was deleted while the attempt ran; the next "
            "attempt gets a new key",
        )
        judged.append(judge(None, lost, REASON_SECRET_DELETED, rules))
    if launcher is not None and launcher.phase == "Failed":
        launcher_pod: Mapping[str, Any] | None = next(
            (p for p in children.launcher_pods if name_of(p) == launcher.pod_name), None
        )
        # Its pod may be gone (evicted: the Job fails once it is deleted); what it
        # said while it terminated counts.
        pod_name = launcher.pod_name or (previous.launcher.pod_name if previous.launcher else None)
        disruption = disruption_of(launcher_pod) if launcher_pod else None
        disruption = disruption or children.launcher_disruptions.get(pod_name or "")
        judged += [
            judge(launcher_pod, f, disruption, rules)
            for f in launcher_failures(children, launcher, pod_name)
        ]
        reason = REASON_WORKER_FAILED if len(judged) > 1 else REASON_LAUNCHER_FAILED
    elif launcher is None and _launcher_vanished(previous, children, attempt):
        judged.append(
            judge(None, _deleted_launcher(previous, children), REASON_LAUNCHER_DELETED, rules)
        )
        reason = REASON_WORKER_FAILED if len(judged) > 1 else REASON_LAUNCHER_DELETED
    return judged, reason


def _secret_lost(
    job: HorovodJob, previous: HorovodJobStatus, children: Children, attempt: int
) -> bool:
    """An mpi attempt under way whose SSH Secret is gone while a worker of it may
    hold its key: one bound to a node (its kubelet mounts the Secret). Workers that
    all still wait for a node would simply mount a new one; any other case would
    give the later launcher a key some workers' sshd does not know. (Secrets are not
    watched: the executor finds one gone before it creates pods that mount it.)"""
    return (
        job.spec.launch_mode == "mpi"
        and previous.phase in ATTEMPT_PHASES
        and children.secret is None
        and any(
            attempt_of(pod) == attempt and (pod.get("spec") or {}).get("nodeName")
            for pod in children.workers
        )
    )


def wrong_world_size(job: HorovodJob, reported: int | None) -> str | None:
    """Why a world of `reported` ranks is not this job's, or None when it is (or is
    unknown). Elastic: anywhere within minReplicas..maxReplicas workers' slots."""
    if reported is None:
        return None
    spec = job.spec
    slots = spec.slots_per_worker
    if spec.elastic is not None:
        low, high = spec.elastic.min_replicas * slots, spec.elastic.max_replicas * slots
        if low <= reported <= high:
            return None
        wanted = f"{low} to {high} (elastic.minReplicas..maxReplicas x slotsPerWorker {slots})"
    else:
        expected = spec.total_slots()
        if reported == expected:
            return None
        wanted = f"{expected} (worker.replicas {spec.worker.replicas} x slotsPerWorker {slots})"
    hint = ""
    if reported < (spec.elastic.min_replicas * slots if spec.elastic else spec.total_slots()):
        hint = (
            ": the ranks did not join one Horovod world (each started its own, e.g. "
            "hvd.init() without the launcher's environment, or a Horovod built with MPI "
            "run under Gloo without HOROVOD_CONTROLLER=gloo)"
        )
    return f"the ranks report a Horovod world of {reported} but the job runs {wanted}{hint}"


def name_of_rank0(job: HorovodJob, previous: HorovodJobStatus) -> str:
    """Where rank 0 prints: the launcher pod (mpi, elastic) or worker 0 (gloo)."""
    if job.spec.launch_mode == "gloo" and job.spec.elastic is None:
        return names.worker_name(job.metadata.name, 0)
    launcher = previous.launcher.pod_name if previous.launcher else None
    return launcher or names.launcher_name(job.metadata.name)


def _failed_attempt(
    status: HorovodJobStatus,
    judged: list[Judged],
    reason: str,
    backoff_limit: int,
    now: datetime,
    message: str | None = None,
) -> HorovodJobStatus:
    everything = [item.failure for item in judged]
    # A status has a budget (etcd's object limit is 1.5 MiB; 700 failed ranks with a
    # 2 KiB log tail each passed it, the write failed and the job stayed Running):
    # the first MAX_FAILURES are kept, the rest only counted in the message.
    status.failures = everything[:MAX_FAILURES]
    message = message or failure_message(everything)
    decisive = outcome(judged)
    assert decisive is not None
    if decisive.action == "FailJob":
        return fail(status, REASON_FAIL_JOB, f"{message}; {decisive.why}", now)
    counted = status.restarts - status.uncounted_restarts
    if decisive.action == "Ignore":
        status.restarts += 1
        status.uncounted_restarts += 1
        status.launcher = None
        enter_phase(
            status,
            "Restarting",
            reason,
            f"{message}; {decisive.why}: restart {status.restarts}, not counted "
            f"({counted} of backoffLimit {backoff_limit} used)",
            now,
        )
        return status
    if counted < backoff_limit:
        status.restarts += 1
        status.launcher = None
        enter_phase(
            status,
            "Restarting",
            reason,
            f"{message}; restart {counted + 1} of {backoff_limit}",
            now,
        )
        return status
    return fail(status, reason, f"{message}; backoffLimit ({backoff_limit}) reached", now)


def failure_message(failures: list[Failure]) -> str:
    """The first MAX_NAMED failures in words, and how many more (bounded)."""
    parts = []
    for failure in failures[:MAX_NAMED]:
        detail = [failure.reason or "Error"]
        if failure.exit_code is not None:
            detail.append(f"exit code {failure.exit_code}")
        container = f" container {failure.container}" if failure.container else ""
        parts.append(f"pod {failure.pod}{container} failed ({', '.join(detail)})")
    if len(failures) > MAX_NAMED:
        parts.append(f"and {len(failures) - MAX_NAMED} more ({len(failures)} failures in all)")
    return "; ".join(parts)


def count_workers(workers: list[Mapping[str, Any]], replicas: int) -> WorkerCounts:
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


def workers_ready_to_start(job: HorovodJob, status: HorovodJobStatus) -> bool:
    """Whether the launcher may start: every worker Ready, or for an elastic job
    the worker.replicas it starts with (the others join when they are Ready)."""
    counts = status.workers
    if counts is None or counts.replicas <= 0:
        return False
    if job.spec.elastic:
        return counts.ready >= job.spec.worker.replicas
    return counts.ready == counts.replicas


# --- comparing statuses ------------------------------------------------------------------

# How far a start has got: worker counters, the launcher's own phase, Pending ->
# Starting, the Created condition and the waiting reason. The reconciler may
# hold a change of these alone for a moment, since a later change (Running, a
# failure) often supersedes it.
PROGRESS_PHASES: Final = frozenset({"Pending", "Starting"})
_PROGRESS_KEYS: Final = frozenset(
    {"workers", "launcher", "phase", "conditions", "reason", "message"}
)


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
