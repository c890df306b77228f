"""What a job under way says while it waits: Stalled and what blocks it, its reason
and message, and the startup timeout that ends a start that does not finish
(compute_status's last step; pure)."""

from __future__ import annotations

from . import elastic, stalled
from .api import HorovodJob, HorovodJobStatus
from .conditions import (
    REASON_PROGRESSING,
    REASON_STARTING_LAUNCHER,
    REASON_STARTUP_TIMEOUT,
    REASON_WAITING,
    REFUSAL_REASONS,
    STALLED,
    clear_condition,
    fail,
    set_condition,
    true_condition,
)
from .plan import Observation


def report(job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> str:
    """Set Stalled, the reason and the message of an attempt under way, and fail it
    past its startup timeout. Returns the Stalled Event's detail (how many pods
    share the cause, a few names)."""
    problems = stalled.problems(job, status, seen)
    detail = ""
    if problems:
        reason, message, detail = stalled.summarize(problems)
        status.conditions = set_condition(
            status.conditions, STALLED, True, reason, message, seen.now
        )
    elif not _refusal_pending(status, seen):
        clear_condition(status, STALLED, REASON_PROGRESSING, seen.now)
    blocked = true_condition(status, STALLED)
    if status.phase == "Running":
        if job.spec.elastic is not None:
            status.message = elastic.waiting_message(
                job, status, stalled.waiting_workers(status, seen)
            )
        return detail
    counts = status.workers
    assert counts is not None
    if blocked is not None:
        status.reason, status.message = blocked.reason, blocked.message
    elif status.phase == "Starting":
        status.reason = REASON_STARTING_LAUNCHER
        status.message = f"{counts.running} worker pod(s) running; waiting for the launcher"
    else:
        status.reason = REASON_WAITING
        status.message = f"{counts.ready}/{counts.replicas} worker pod(s) ready"

    timeout = stalled.startup_timeout(status, job.spec.run_policy.startup_timeout_seconds, seen.now)
    if timeout is not None:
        fail(status, REASON_STARTUP_TIMEOUT, timeout, seen.now)
    return detail


def _refusal_pending(status: HorovodJobStatus, seen: Observation) -> bool:
    """A job Stalled by an API refusal stays so until what was refused exists: a
    restarted operator has no refusal in memory until it tries again, and clearing
    the condition meanwhile flipped it False and back (a new lastTransitionTime, a
    second Warning Event for the same refusal). The status is the durable record."""
    stalled_by = true_condition(status, STALLED)
    if stalled_by is None or stalled_by.reason not in REFUSAL_REASONS or seen.refusals:
        return False
    return stalled.refused_and_missing(stalled_by.message, status, seen.children)
