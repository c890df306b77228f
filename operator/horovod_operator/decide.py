"""Decide: one pure function from what is observed to what to do.

:func:`decide` takes the job as stored, the children it controls, what the API
server refused lately and the time, and returns a :class:`~.plan.Plan`: the
status to write, the Events to post, the objects to delete and create, when to
look again. The reconciler only executes plans, so this is tested as a table
without a cluster.

This module decides which way the job goes: its spec, a rejected edit, Kueue's
gate. The status itself, every phase and way to fail with its reason and message,
is phases.compute_status's; what it means for the children comes from pure helpers
beside this one: plan_creates (what the attempt lacks, the launcher gate),
plan_deletes (pods, cleanup, TTL) and plan_notices (Events, timers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from . import elastic, multikueue, names, queueing, stalled
from .api import (
    ATTEMPT_PHASES,
    STARTED_PHASES,
    STARTING_PHASES,
    TERMINAL_PHASES,
    HorovodJob,
    HorovodJobSpec,
    HorovodJobStatus,
    ObjectMeta,
    RunPolicy,
    format_validation_error,
    parse_job,
    parse_status,
)
from .conditions import (
    FAILED,
    REASON_INVALID_SPEC,
    REASON_PROGRESS_NOT_READ,
    SPEC_REJECTED,
    set_condition,
    true_condition,
)
from .phases import compute_status, invalid_spec_status
from .plan import Event, Observation, Plan, Refusal
from .plan_creates import ensure_children
from .plan_deletes import delete_everything, delete_pods, finish, force_delete_stuck_pods
from .plan_notices import (
    requeue_for_timers,
    say_no_gang,
    say_uncounted_claims,
    transition_events,
)
from .validation import template_policy_violations

# A job that waits for its ResourceClaimTemplate looks again this often (claims.py).
CLAIM_RETRY: Final = 10.0
# The field to name when the API server refuses a child built from it.
_REFUSED_FIELD: Final = {
    ("Pod", "worker"): ("spec.worker.template", "worker pod"),
    ("Job", "launcher"): ("spec.launcher.template", "launcher Job"),
    ("ConfigMap", None): ("spec.worker.replicas", "ConfigMap with the hostfile"),
    ("Workload", None): ("spec.scheduling.queue", "Kueue Workload"),
    # Volcano's webhook refuses a PodGroup whose queue is missing or closed.
    ("PodGroup", "worker"): ("spec.scheduling", "gang's PodGroup"),
}


def decide(seen: Observation) -> Plan:
    body = seen.body
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Plan()  # garbage collection removes the children
    if multikueue.dispatched(body):
        return multikueue.plan_dispatch(seen)  # it runs on a worker cluster
    previous = parse_status(body.get("status"))
    generation = int(meta.get("generation") or 0)
    rejected_edit: str | None = None
    stand_in = False  # driven on a stand-in spec: the accepted one is lost
    job: HorovodJob | None = None
    try:
        job = parse_job(body, seen.default_image)
        problem = "; ".join(policy_violations(job)) if seen.restrict_templates else ""
    except ValidationError as error:
        problem = format_validation_error(error)
    if problem:
        if _finished(previous):
            # Its outcome stands, and so do the pods cleanPodPolicy kept: say why the
            # edit is ignored, touch nothing.
            return _rejected_without_spec(seen, previous, problem, generation)
        if not _started(previous):
            return _invalid(seen, previous, problem, generation)
        spec = seen.accepted_spec
        stand_in = spec is None
        rejected_edit = f"the edit of generation {generation} is ignored: {problem}"
        if spec is None:
            spec = _stand_in_spec(body, previous)
            if spec is None:
                return _rejected_without_spec(seen, previous, problem, generation)
            rejected_edit += f". {_STAND_IN}"
        # A started job runs on the spec it last accepted.
        job = HorovodJob(metadata=ObjectMeta.model_validate(meta), spec=spec, status=previous)
    assert job is not None
    if seen.worker_claims is not None and seen.worker_claims.gpus:
        worker = job.spec.worker.with_claimed_gpus(seen.worker_claims.gpus)
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"worker": worker})})
    if _spec_fixed(job):
        job.status = None  # failed for its spec, and the spec changed: start afresh
    permanent = [r for r in seen.refusals if r.permanent and r.generation == generation]
    if permanent and (job.status is None or job.status.phase not in TERMINAL_PHASES):
        return _invalid(seen, job.status, _refusal_message(permanent[0]), generation)

    accepted_spec = job.spec  # as the user wrote it, before Kueue's partial admission
    queue: queueing.Gate | None = None
    if queueing.managed(job, seen) and (
        job.status is None or job.status.phase not in TERMINAL_PHASES
    ):
        queue = queueing.gate(job, seen, job.status.restarts if job.status else 0)
        admitted = (queue.admissions or {}).get(names.ROLE_WORKER)
        if admitted is not None and admitted.count is not None:
            # An elastic job Kueue admitted in part runs with what it got.
            job = job.model_copy(update={"spec": job.spec.admitted(admitted.count)})
    hold = queue.hold if queue is not None else None
    computed = compute_status(job, seen, rejected_edit, hold)
    status = computed.status
    plan = Plan(status=status, accepted_spec=accepted_spec if rejected_edit is None else None)
    if queue is not None:
        if queue.create is not None and not job.spec.run_policy.suspend:
            plan.creates.append(queue.create)
        plan.workload_status = queue.patch
        plan.workload_adopt = queue.adopt
    if status.phase in ATTEMPT_PHASES:
        if job.spec.elastic is not None:
            plan.deletes += elastic.failed_pods(status, seen)
        if stand_in:
            # Nothing is created from a stand-in: it has no templates.
            plan.events = transition_events(previous, status, computed.stalled_detail)
            plan.events += computed.events
            requeue_for_timers(plan, job, status, seen.now)
            return plan
        # The spec this attempt runs on, as the ConfigMap records it (accepted.py).
        ran_on = (
            (generation, body.get("spec") or {}) if rejected_edit is None else seen.accepted_raw
        )
        # The spec's validation covers every place the builders read a template
        # (tests/operator/test_template_shapes.py): an exception here is our bug, for
        # the reconcile loop to log and retry, never the user's InvalidSpec.
        ensure_children(plan, job, status, seen, queue, ran_on)
    elif status.phase in ("Restarting", "Suspended"):
        delete_pods(plan, seen, None, with_launcher=True)
        if status.elastic is not None:
            # Its pods go on purpose: none of them is lost, and the next ones are new.
            status.elastic.worker_uids = {}
    elif status.phase in TERMINAL_PHASES:
        finish(plan, job, status, seen)
        if seen.kueue_api:
            plan.workload_status = queueing.finished_patch(seen.children, status, seen.now)
    if queue is not None and plan.workload_status is None and status.phase not in TERMINAL_PHASES:
        plan.workload_status = queueing.pods_ready_patch(
            seen.children.workload, queueing.pods_started(job, status), seen.now
        )
    plan.events = transition_events(previous, status, computed.stalled_detail) + computed.events
    if previous is None and job.spec.run_policy.progress_deadline_seconds and not seen.reads_logs:
        plan.events.append(
            Event(
                "Warning",
                REASON_PROGRESS_NOT_READ,
                "runPolicy.progressDeadlineSeconds is set, but this operator reads no pod "
                "logs (--no-first-step-metric; chart metrics.firstStep.enabled=false): no "
                "hang will be found. Fix: ask the operator's admin to turn log reading on",
            )
        )
    if previous is None:
        say_no_gang(plan, job, status, seen)
        say_uncounted_claims(plan, job, seen)
    requeue_for_timers(plan, job, status, seen.now)
    if queue is not None and queue.requeue_after is not None:
        plan.requeue_after = min(plan.requeue_after or queue.requeue_after, queue.requeue_after)
    if status.phase in STARTING_PHASES and stalled.claims_problem(job, seen) is not None:
        # ResourceClaimTemplates are not watched: look again for the one created or fixed.
        plan.requeue_after = min(plan.requeue_after or CLAIM_RETRY, CLAIM_RETRY)
    force_delete_stuck_pods(plan, seen)
    return plan


def policy_violations(job: HorovodJob) -> list[str]:
    """The opt-in template policy's refusals for both templates."""
    name = job.metadata.name
    return [
        *template_policy_violations(name, "spec.worker.template", job.spec.worker.template),
        *template_policy_violations(name, "spec.launcher.template", job.spec.launcher.template),
    ]


def _started(status: HorovodJobStatus | None) -> bool:
    return status is not None and (status.phase in STARTED_PHASES or status.phase == "Suspended")


def _finished(status: HorovodJobStatus | None) -> bool:
    """Succeeded, or Failed for a reason other than its spec (which an edit may fix)."""
    if status is None or status.phase not in TERMINAL_PHASES:
        return False
    failed = true_condition(status, FAILED)
    return failed is None or failed.reason != REASON_INVALID_SPEC


def _spec_fixed(job: HorovodJob) -> bool:
    """A job failed for an invalid spec whose spec changed since."""
    if job.status is None:
        return False
    failed = true_condition(job.status, FAILED)
    return (
        failed is not None
        and failed.reason == REASON_INVALID_SPEC
        and job.status.observed_generation != job.metadata.generation
    )


# --- invalid specs and rejected edits -----------------------------------------------------


def _invalid(
    seen: Observation, previous: HorovodJobStatus | None, message: str, generation: int
) -> Plan:
    """Failed/InvalidSpec: an Event, nothing of the job left, no retries until the
    spec changes."""
    if previous is not None and (
        previous.phase == "Succeeded"
        or (previous.phase == "Failed" and previous.observed_generation == generation)
    ):
        status = previous  # finished, or already reported for this generation
    else:
        status = invalid_spec_status(previous, message, generation, seen.now)
    plan = Plan(status=status, events=transition_events(previous, status))
    delete_everything(plan, seen)
    if seen.kueue_api:
        plan.workload_status = queueing.finished_patch(seen.children, status, seen.now)
    return plan


_STAND_IN: Final = (
    "The spec it last accepted is lost (not in its ConfigMap), so the job runs to its "
    "end on the pods it has: no restart and no new pod; fix the spec to manage it fully"
)


def _stand_in_spec(
    body: Mapping[str, Any], previous: HorovodJobStatus | None
) -> HorovodJobSpec | None:
    """A started job with a rejected edit whose accepted spec is lost (its ConfigMap was
    deleted, or the spec was too big to keep): enough of a spec to drive it to its end
    on its children. The worker count the status recorded, the launch mode, and the
    edit's runPolicy where that part is valid (else the defaults), with no restart:
    the outcome is read, timers fire, cleanPodPolicy and the TTL apply. None for an
    elastic job (its size is not in the status the same way): left alone as before."""
    raw = body.get("spec") or {}
    if raw.get("elastic") or previous is None or previous.workers is None:
        return None
    policy: dict[str, Any] = raw["runPolicy"] if isinstance(raw.get("runPolicy"), dict) else {}
    try:
        RunPolicy.model_validate(policy)
    except ValidationError:
        policy = {}
    mode = raw.get("launchMode") if raw.get("launchMode") in ("mpi", "gloo") else "mpi"
    stand_in = {
        "image": "unknown",
        "command": ["unknown"],
        "launchMode": mode,
        "worker": {"replicas": previous.workers.replicas},
        "runPolicy": {**policy, "backoffLimit": 0},
    }
    try:
        return HorovodJobSpec.model_validate(stand_in)
    except ValidationError:
        return None


def _rejected_without_spec(
    seen: Observation, previous: HorovodJobStatus | None, message: str, generation: int
) -> Plan:
    """A started job whose spec fails validation, and no accepted spec is known
    (the operator restarted since), or a finished job: touch nothing, say why."""
    status = (previous or HorovodJobStatus()).model_copy(deep=True)
    text = (
        f"the edit of generation {generation} is ignored: {message}. The job's pods are "
        f"left as they are; fix the spec to let the operator manage the job again"
    )
    status.conditions = set_condition(
        status.conditions, SPEC_REJECTED, True, REASON_INVALID_SPEC, text, seen.now
    )
    return Plan(status=status, events=transition_events(previous, status))


def _refusal_message(refusal: Refusal) -> str:
    field, what = _REFUSED_FIELD.get(
        (refusal.kind, refusal.role), ("metadata.name", f"{refusal.kind} {refusal.name}")
    )
    return f"{field}: the API server rejected the {what} ({refusal.code}): {refusal.message}"
