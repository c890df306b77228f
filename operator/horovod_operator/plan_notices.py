"""What a plan tells: the Events of a job's transitions, the warnings said once, and
when to look again for its timers (decide.py's helper; pure)."""

from __future__ import annotations

from datetime import datetime
from typing import Final, get_args

from .api import (
    STARTED_PHASES,
    STARTING_PHASES,
    TERMINAL_PHASES,
    HorovodJob,
    HorovodJobStatus,
    Phase,
)
from .conditions import (
    GANG_SCHEDULED,
    REASON_CLAIMS_WITHOUT_GPUS,
    REASON_NO_GANG_SCHEDULER,
    REASON_RESUMED,
    SPEC_REJECTED,
    STALLED,
    due_time,
    set_condition,
    true_condition,
)
from .plan import Event, Observation, Plan

# Timers further away than this are re-checked then (a long deadline costs one
# cheap reconcile an hour instead of a timer that outlives its reason).
MAX_REQUEUE: Final = 3600.0
# Every phase but those of a start, which the status shows as it moves.
_EVENT_PHASES: Final = frozenset(get_args(Phase)) - STARTING_PHASES


def transition_events(
    previous: HorovodJobStatus | None, status: HorovodJobStatus, stalled_detail: str = ""
) -> list[Event]:
    """An Event for each transition users act on: phases (not Pending/Starting, which
    the status shows), a new reason to be stalled (with `stalled_detail`: how many
    pods share it, a few names), a rejected edit."""
    before = previous or HorovodJobStatus()
    events = []
    moved = status.phase != before.phase and status.phase is not None
    if moved and (status.phase in _EVENT_PHASES or before.phase == "Suspended"):
        warning = status.phase in ("Restarting", "Failed")
        reason = status.reason or str(status.phase)
        message = status.message or ""
        if before.phase == "Suspended":
            reason, message = REASON_RESUMED, "the job is resumed"
        events.append(Event("Warning" if warning else "Normal", reason, message))
    for type_, event_reason in ((STALLED, None), (SPEC_REJECTED, SPEC_REJECTED)):
        now_true = true_condition(status, type_)
        was_true = true_condition(before, type_)
        if now_true is None:
            continue
        if was_true is None or (was_true.reason, was_true.message) != (
            now_true.reason,
            now_true.message,
        ):
            detail = stalled_detail if type_ == STALLED else ""
            message = now_true.message + detail
            events.append(Event("Warning", event_reason or now_true.reason, message))
    return events


def say_no_gang(plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> None:
    """gang.policy Auto on a cluster that serves no gang API: never silent (a 1.36
    cluster serves the Workload API as scheduling.k8s.io/v1alpha2, which this
    operator does not speak; an older one none at all)."""
    gang = job.spec.scheduling.gang
    if gang.policy != "Auto" or gang.needs_native() or seen.gang_api is not False:
        return  # with shared claims, Auto waits for the gang (stalled.problems)
    if job.spec.worker_count() < 2:
        return
    message = (
        "spec.scheduling.gang.policy is Auto, but the cluster serves no "
        "scheduling.k8s.io/v1beta1 PodGroup (Kubernetes 1.37 with the GenericWorkload gate): "
        "the workers are placed one by one, and those placed hold their GPUs while the "
        "others wait. Fix: enable the gate, or set the policy to Volcano or Coscheduling "
        "where one is installed; policy None says no gang is wanted"
    )
    status.conditions = set_condition(
        status.conditions, GANG_SCHEDULED, False, REASON_NO_GANG_SCHEDULER, message, seen.now
    )
    plan.events.append(Event("Warning", REASON_NO_GANG_SCHEDULER, message))


def say_uncounted_claims(plan: Plan, job: HorovodJob, seen: Observation) -> None:
    """Claims that ask for devices, none of them GPUs the operator counts, on a job
    with no other GPU: said once, since a GPU class it does not know would leave the
    ranks' GPU guard and the slots check off."""
    claimed = seen.worker_claims
    if claimed is None or not claimed.uncounted or job.spec.worker.gpus():
        return
    plan.events.append(
        Event(
            "Warning",
            REASON_CLAIMS_WITHOUT_GPUS,
            f"the worker's ResourceClaimTemplates ask for devices of class(es) "
            f"{', '.join(claimed.uncounted)}, none of which this operator counts as GPUs "
            "(--gpu-device-classes), so HVJOB_GPUS_PER_WORKER is unset and slotsPerWorker "
            "is not checked against them. Fix, if they are GPUs: ask the operator's admin "
            "to add the class (chart value dra.gpuDeviceClasses)",
        )
    )


def requeue_for_timers(
    plan: Plan, job: HorovodJob, status: HorovodJobStatus, now: datetime
) -> None:
    policy = job.spec.run_policy
    dues = []
    if status.phase in STARTED_PHASES:
        dues.append(due_time(status.start_time, policy.active_deadline_seconds))
    if status.phase in STARTING_PHASES:
        dues.append(due_time(status.attempt_start_time, policy.startup_timeout_seconds))
    if status.phase in TERMINAL_PHASES and not plan.delete_job:
        dues.append(due_time(status.completion_time, policy.ttl_seconds_after_finished))
    waits = [(due - now).total_seconds() + 0.5 for due in dues if due is not None]
    if waits:
        plan.requeue_after = min(MAX_REQUEUE, max(0.0, min(waits)))
