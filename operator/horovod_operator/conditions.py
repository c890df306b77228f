"""Conditions of a HorovodJob: their types, reasons, and how they change.

Each phase but Pending and Starting has a condition of its own that is True
while the job is in it (Running, Restarting, Suspended, Succeeded, Failed).
Three more describe the job beside its phase: Created (every child exists),
Stalled (what a job that is not progressing waits for, naming the pod and the
scheduler's, kubelet's or API server's message) and SpecRejected (an edit the
running job ignores). `kubectl wait --for=condition=Stalled` works on them.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from .api import Condition, HorovodJobStatus, Phase

# Condition types.
CREATED: Final = "Created"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
SPEC_REJECTED: Final = "SpecRejected"
STALLED: Final = "Stalled"
# False when gang.policy Auto finds no gang scheduler: the workers are placed one
# by one (set once, at the job's first status, with a Warning Event).
GANG_SCHEDULED: Final = "GangScheduled"
REASON_NO_GANG_SCHEDULER: Final = "NoGangScheduler"

# Reasons of phases and outcomes.
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_WORKER_FAILED: Final = "WorkerFailed"
REASON_LAUNCHER_FAILED: Final = "LauncherFailed"
REASON_LAUNCHER_DELETED: Final = "LauncherDeleted"
REASON_POD_DELETED: Final = "PodDeleted"
# The job's SSH Secret deleted while an attempt ran (its workers hold the old key).
REASON_SECRET_DELETED: Final = "SecretDeleted"
REASON_FAIL_JOB: Final = "PodFailurePolicy"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_STARTUP_TIMEOUT: Final = "StartupTimeout"
# runPolicy.progressDeadlineSeconds passed without a new step (progress.py).
REASON_HUNG: Final = "Hung"
# The ranks report a Horovod world other than the job's (progress.py).
REASON_WRONG_WORLD_SIZE: Final = "WrongWorldSize"
# A progress deadline on an operator that reads no logs (an Event).
REASON_PROGRESS_NOT_READ: Final = "ProgressNotRead"
REASON_SUCCEEDED: Final = "LauncherSucceeded"
REASON_CREATED: Final = "ChildrenCreated"
REASON_LAUNCHER_RUNNING: Final = "LauncherRunning"
REASON_WAITING: Final = "WaitingForWorkers"
REASON_STARTING_LAUNCHER: Final = "StartingLauncher"
REASON_SUSPENDED: Final = "JobSuspended"
REASON_RESUMED: Final = "JobResumed"
REASON_RESTARTED: Final = "Restarted"
# Reasons of SpecRejected.
REASON_SPEC_ACCEPTED: Final = "SpecAccepted"
REASON_REPLICAS_IMMUTABLE: Final = "ReplicasImmutable"
# Elastic jobs (elastic.py): a worker lost and replaced, the count of Ready workers.
REASON_WORKER_LOST: Final = "WorkerLost"
REASON_RESIZED: Final = "Resized"
# Reasons of Stalled. A pod's own reason (Unschedulable, ErrImagePull,
# ImagePullBackOff, CreateContainerConfigError, FailedMount, CrashLoopBackOff,
# ...) is used as it is.
REASON_PROGRESSING: Final = "Progressing"
REASON_CREATE_FORBIDDEN: Final = "CreateForbidden"
# A create answered 429 (API Priority and Fairness) or 5xx (an admission webhook that
# is down with failurePolicy Fail, an overloaded or restarting API server).
REASON_CREATE_THROTTLED: Final = "CreateThrottled"
REASON_CREATE_FAILED: Final = "CreateFailed"
# The Stalled reasons of a refused create: they stand until the object is created.
REFUSAL_REASONS: Final = frozenset(
    {REASON_CREATE_FORBIDDEN, REASON_CREATE_THROTTLED, REASON_CREATE_FAILED}
)
REASON_CHILD_CONFLICT: Final = "ChildConflict"
REASON_OLD_CHILD: Final = "WaitingForPreviousJob"
REASON_GANG_UNAVAILABLE: Final = "GangSchedulingUnavailable"
# A feature the job needs (a queue, a gang) whose discovery has not answered yet.
REASON_DISCOVERY_PENDING: Final = "APIDiscoveryPending"
# The worker's DRA claims (claims.py): a ResourceClaimTemplate that does not exist,
# one whose GPU count is known only after allocation, or fewer GPUs than ranks.
REASON_CLAIM_TEMPLATE_NOT_FOUND: Final = "ClaimTemplateNotFound"
REASON_CLAIM_NOT_COUNTABLE: Final = "ClaimNotCountable"
REASON_CLAIM_TEMPLATE_UNREADABLE: Final = "ClaimTemplateUnreadable"
REASON_TOO_FEW_GPUS: Final = "TooFewGPUs"
# A Warning: the claims ask for devices, none of a class counted as GPUs.
REASON_CLAIMS_WITHOUT_GPUS: Final = "ClaimsWithoutGPUs"
# Reasons of a job that Kueue admits (queueing.py): Suspended until its Workload is
# admitted, and again while an eviction takes its pods.
REASON_QUEUED_BY_KUEUE: Final = "QueuedByKueue"
REASON_EVICTED_BY_KUEUE: Final = "EvictedByKueue"
REASON_PRIORITY_CLASS_NOT_FOUND: Final = "PriorityClassNotFound"
REASON_WORKLOAD_FINISHED: Final = "WorkloadFinished"

# The condition that each phase sets True; the others among them go False.
PHASE_CONDITION: Final[dict[str, str]] = {
    "Running": RUNNING,
    "Restarting": RESTARTING,
    "Suspended": SUSPENDED,
    "Succeeded": SUCCEEDED,
    "Failed": FAILED,
}
_TRANSIENT_CONDITIONS: Final = (RUNNING, RESTARTING, SUSPENDED)


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=4096)
def parse_time(value: str) -> datetime:
    """An API timestamp (seconds, UTC). Cached: every reconcile reads its pods' stamps
    again, and strptime was 6 % of the operator's CPU at 512 workers (py-spy,
    2026-12-07); the stamps are whole seconds, so few are distinct."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def due_time(start: str | None, seconds: int | None) -> datetime | None:
    """start + seconds, or None when either is unset. The API bounds both (a year
    at most), so this never leaves datetime's range."""
    if start is None or seconds is None:
        return None
    return parse_time(start) + timedelta(seconds=seconds)


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
    previous = next((c for c in conditions if c.type == type_), None)
    since = format_time(now)
    if previous is not None and previous.status == value:
        since = previous.last_transition_time
    updated = Condition(
        type=type_, status=value, reason=reason, message=message, last_transition_time=since
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]


def condition_of(status: HorovodJobStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def true_condition(status: HorovodJobStatus, type_: str) -> Condition | None:
    """The condition `type_` when it is True."""
    found = condition_of(status, type_)
    return found if found is not None and found.status == "True" else None


def clear_condition(status: HorovodJobStatus, type_: str, reason: str, now: datetime) -> None:
    """Set `type_` False when it exists and is True (a condition never set stays absent)."""
    if true_condition(status, type_) is not None:
        status.conditions = set_condition(status.conditions, type_, False, reason, "", now)


def enter_phase(
    status: HorovodJobStatus, phase: Phase, reason: str, message: str, now: datetime
) -> None:
    """Set phase, reason and message, and the phase's condition True; the other
    transient conditions go False."""
    status.phase = phase
    status.reason, status.message = reason, message
    conditions = status.conditions
    own = PHASE_CONDITION.get(phase)
    for type_ in _TRANSIENT_CONDITIONS:
        current = condition_of(status, type_)
        if type_ != own and current is not None and current.status == "True":
            conditions = set_condition(conditions, type_, False, reason, message, now)
    if own is not None:
        conditions = set_condition(conditions, own, True, reason, message, now)
    status.conditions = conditions


def fail(status: HorovodJobStatus, reason: str, message: str, now: datetime) -> HorovodJobStatus:
    """Failed for `reason`, finished now."""
    status.completion_time = format_time(now)
    enter_phase(status, "Failed", reason, message, now)
    return status
