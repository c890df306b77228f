"""The one home of a job's status: what is observed in, the next status out.

:func:`compute_status` decides every phase, every way to fail and every reason and
message; :mod:`horovod_operator.decide` plans what the status means for the
children. It reads the previous status only for what the children cannot tell (the
restart count, the start times, when conditions moved) and derives the rest, so an
operator restarted at any point computes the same status from the same cluster.

Its helpers: a failed attempt's judgement and its restart or failure in
:mod:`horovod_operator.attempt_failures`; an elastic job's losses in
:mod:`horovod_operator.elastic`; what a job under way waits for, and its startup
timeout, in :mod:`horovod_operator.waiting`. Comparing a status with the stored one
is status_writing's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import elastic, waiting
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
from .attempt_failures import failed_attempt, judge_failures, name_of_rank0, wrong_world_size
from .children import Children, current_workers, launcher_state, stale_children
from .conditions import (
    CREATED,
    REASON_CREATED,
    REASON_DEADLINE,
    REASON_HUNG,
    REASON_INVALID_SPEC,
    REASON_LAUNCHER_RUNNING,
    REASON_REPLICAS_IMMUTABLE,
    REASON_RESTARTED,
    REASON_RESUMED,
    REASON_SPEC_ACCEPTED,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    REASON_WRONG_WORLD_SIZE,
    RESTARTING,
    SPEC_REJECTED,
    SUSPENDED,
    clear_condition,
    due_time,
    enter_phase,
    fail,
    format_time,
    set_condition,
)
from .failures import Judged
from .plan import Event, Observation
from .pod_state import pod_phase, pod_ready


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


@dataclass
class Computed:
    """compute_status's answer: the next status, and what only its computation knows
    for the plan's Events (decide.py adds them to the transitions')."""

    status: HorovodJobStatus
    # An elastic job's lost workers and resizes.
    events: list[Event] = field(default_factory=list)
    # How many pods share the Stalled cause, and a few names (its Event's tail).
    stalled_detail: str = ""


def compute_status(
    job: HorovodJob,
    seen: Observation,
    rejected_edit: str | None = None,
    hold: tuple[str, str] | None = None,
) -> Computed:
    """The next status of `job` given what is observed: every phase, every way to
    fail, every reason and message.

    The phase machine comes first (`_next_phase`); an attempt under way then
    accounts for an elastic job's lost workers (elastic.track, which can fail the
    job), says what it waits for, and fails when its start outlives the startup
    timeout (waiting.report).
    """
    status = _next_phase(job, seen.children, seen.now, rejected_edit, hold)
    computed = Computed(status)
    if status.phase not in ATTEMPT_PHASES:
        return computed
    if job.spec.elastic is not None:
        events, fatal = elastic.track(job, job.status, status, seen)
        if fatal is not None:
            fail(status, *fatal, seen.now)
            return computed
        computed.events = events
    computed.stalled_detail = waiting.report(job, status, seen)
    return computed


def _next_phase(
    job: HorovodJob,
    children: Children,
    now: datetime,
    rejected_edit: str | None = None,
    hold: tuple[str, str] | None = None,
) -> HorovodJobStatus:
    """The phase machine: the next status of `job` given its own children.

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
            if previous.phase in STARTED_PHASES:
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
    judged, reason = judge_failures(
        job, previous, children, workers, launcher, attempt, active_replicas(job)
    )
    if judged:
        return failed_attempt(status, judged, reason, policy.backoff_limit, now)
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
            return failed_attempt(status, hung, REASON_HUNG, policy.backoff_limit, now, message)

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
