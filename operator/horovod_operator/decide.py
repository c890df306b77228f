"""Decide: one pure function from what is observed to what to do.

:func:`decide` takes the job as stored, the children it controls, what the API
server refused lately and the time, and returns a :class:`~.plan.Plan`: the
status to write, the Events to post, the objects to delete and create, when to
look again. Every decision lives here: validation and rejected edits, the
launcher gate, stuck states, restarts, deadlines, the startup timeout, cleanup
and TTL. The reconciler only executes plans, so this is tested as a table
without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from . import accepted, builders, elastic, names, queueing, stalled
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
from .children import (
    is_terminating,
    labels_of,
    metadata_of,
    name_of,
    pod_phase,
    role_of,
    uid_of,
)
from .conditions import (
    FAILED,
    GANG_SCHEDULED,
    REASON_CLAIMS_WITHOUT_GPUS,
    REASON_DEADLINE,
    REASON_INVALID_SPEC,
    REASON_NO_GANG_SCHEDULER,
    REASON_PROGRESS_NOT_READ,
    REASON_PROGRESSING,
    REASON_RESUMED,
    REASON_STARTING_LAUNCHER,
    REASON_STARTUP_TIMEOUT,
    REASON_WAITING,
    REFUSAL_REASONS,
    SPEC_REJECTED,
    STALLED,
    clear_condition,
    parse_time,
    set_condition,
    true_condition,
)
from .phases import (
    active_replicas,
    compute_status,
    due_time,
    fail,
    invalid_spec_status,
    workers_ready_to_start,
)
from .plan import Delete, Event, Observation, Plan, PodSweep, Refusal
from .validation import template_policy_violations

# A job that waits for its ResourceClaimTemplate looks again this often (claims.py).
CLAIM_RETRY: Final = 10.0
# Timers further away than this are re-checked then (a long deadline costs one
# cheap reconcile an hour instead of a timer that outlives its reason).
MAX_REQUEUE: Final = 3600.0
_EVENT_PHASES: Final = frozenset({"Running", "Restarting", "Suspended", "Succeeded", "Failed"})
# Failures after which nothing of the job keeps running, whatever cleanPodPolicy.
_STOP_EVERYTHING: Final = frozenset({REASON_DEADLINE, REASON_INVALID_SPEC, REASON_STARTUP_TIMEOUT})
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

    queue: queueing.Gate | None = None
    if queueing.managed(job, seen) and (
        job.status is None or job.status.phase not in TERMINAL_PHASES
    ):
        queue = queueing.gate(job, seen, job.status.restarts if job.status else 0)
    hold = queue.hold if queue is not None else None
    status = compute_status(job, seen.children, seen.now, rejected_edit, hold)
    lost: tuple[list[Delete], list[Event]] = ([], [])
    if job.spec.elastic is not None and status.phase in ATTEMPT_PHASES:
        deletes, lost_events, fatal = elastic.track(job, previous, status, seen)
        lost = (deletes, lost_events)
        if fatal is not None:
            fail(status, fatal[0], fatal[1], seen.now)
            lost = ([], [])
    plan = Plan(status=status, accepted_spec=job.spec if rejected_edit is None else None)
    if queue is not None:
        if queue.create is not None and not job.spec.run_policy.suspend:
            plan.creates.append(queue.create)
        plan.workload_status = queue.patch
    if status.phase in ATTEMPT_PHASES:
        plan.deletes += lost[0]
        if stand_in:
            # Nothing is created from a stand-in: it has no templates.
            _report_progress(plan, job, status, seen)
            plan.events = _events(previous, status, plan.stalled_detail) + lost[1]
            _requeue_for_timers(plan, job, status, seen.now)
            return plan
        # The spec this attempt runs on, as the ConfigMap records it (accepted.py).
        ran_on = (
            (generation, body.get("spec") or {}) if rejected_edit is None else seen.accepted_raw
        )
        # The spec's validation covers every place the builders read a template
        # (tests/operator/test_template_shapes.py): an exception here is our bug, for
        # the reconcile loop to log and retry, never the user's InvalidSpec.
        _ensure_children(plan, job, status, seen, queue, ran_on)
        _report_progress(plan, job, status, seen)
    elif status.phase in ("Restarting", "Suspended"):
        _delete_pods(plan, seen, None, with_launcher=True)
        if status.elastic is not None:
            # Its pods go on purpose: none of them is lost, and the next ones are new.
            status.elastic.worker_uids = {}
    elif status.phase in TERMINAL_PHASES:
        _finish(plan, job, status, seen)
        if seen.kueue_api:
            plan.workload_status = queueing.finished_patch(seen.children, status, seen.now)
    if queue is not None and plan.workload_status is None and status.phase not in TERMINAL_PHASES:
        plan.workload_status = queueing.pods_ready_patch(
            seen.children.workload, queueing.pods_started(job, status), seen.now
        )
    plan.events = _events(previous, status, plan.stalled_detail) + lost[1]
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
        _say_no_gang(plan, job, status, seen)
        _say_uncounted_claims(plan, job, seen)
    _requeue_for_timers(plan, job, status, seen.now)
    if queue is not None and queue.requeue_after is not None:
        plan.requeue_after = min(plan.requeue_after or queue.requeue_after, queue.requeue_after)
    if status.phase in STARTING_PHASES and stalled.claims_problem(job, seen) is not None:
        # ResourceClaimTemplates are not watched: look again for the one created or fixed.
        plan.requeue_after = min(plan.requeue_after or CLAIM_RETRY, CLAIM_RETRY)
    _force_delete_stuck_pods(plan, seen)
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
    plan = Plan(status=status, events=_events(previous, status))
    _delete_everything(plan, seen)
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
    return Plan(status=status, events=_events(previous, status))


def _refusal_message(refusal: Refusal) -> str:
    field, what = _REFUSED_FIELD.get(
        (refusal.kind, refusal.role), ("metadata.name", f"{refusal.kind} {refusal.name}")
    )
    return f"{field}: the API server rejected the {what} ({refusal.code}): {refusal.message}"


# --- creating ----------------------------------------------------------------------------


def _with_replicas(job: HorovodJob, replicas: int) -> HorovodJob:
    if replicas == job.spec.worker_count() or job.spec.elastic:
        return job
    worker = job.spec.worker.model_copy(update={"replicas": replicas})
    spec = job.spec.model_copy(update={"worker": worker})
    return job.model_copy(update={"spec": spec})


def _ensure_children(
    plan: Plan,
    job: HorovodJob,
    status: HorovodJobStatus,
    seen: Observation,
    queue: queueing.Gate | None = None,
    ran_on: tuple[int, Mapping[str, Any]] | None = None,
) -> None:
    """Create what the attempt lacks; never an object whose name another holds.
    A job that Kueue admits gets its pods only where the admission puts them.
    `ran_on`: (generation, raw spec) of the spec it runs on, kept in the ConfigMap."""
    if stalled.undiscovered(job, seen):
        return  # fail closed: nothing until the cluster says what it serves
    children = seen.children
    job = _with_replicas(job, active_replicas(job.model_copy(update={"status": status})))
    attempt = status.restarts

    def want(obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] not in children.foreign:
            plan.creates.append(obj)

    ssh = job.spec.launch_mode == "mpi"
    if ssh and children.secret is None and seen.keys is not None and seen.host_key is not None:
        want(builders.new_ssh_secret(job, seen.keys, seen.host_key))
    config_map = builders.new_config_map(job)
    if children.config_map is None:
        if ran_on is not None:
            config_map["metadata"]["annotations"] = accepted.record(*ran_on)
        want(config_map)
    else:
        if children.config_map.get("data") != config_map["data"] and not children.workers:
            # A resume or restart with another shape: the new attempt gets its hostfile
            # before its pods (a running attempt keeps the one it started with).
            plan.config_data = config_map["data"]
        if ran_on is not None and accepted.generation(children.config_map) != ran_on[0]:
            plan.config_annotations = accepted.record(*ran_on)
    if children.service is None:
        want(builders.new_worker_service(job))

    existing = {name_of(pod) for pod in children.workers}
    missing = [
        i
        for i in range(job.spec.worker_count())
        if names.worker_name(job.metadata.name, i) not in existing
    ]
    gang = gang_scheduled(job, seen)
    required = job.spec.scheduling.gang.policy not in ("Auto", "None")
    if (required or job.spec.scheduling.gang.needs_native()) and not gang:
        return  # no worker without its required gang; stalled.problems says why
    admissions: dict[str, builders.Admission | None] = {}
    if queue is not None:
        if queue.admissions is None:
            return  # admitted, but a flavor is not read yet
        admissions = dict(queue.admissions)
    if missing and stalled.claims_problem(job, seen) is not None:
        return  # stalled.problems names the claim and the fix
    if missing and gang:
        # Before its pods: the scheduler holds them until their group is complete.
        want(builders.new_pod_group(job, attempt, admissions.get(names.ROLE_WORKER)))
    for index in missing:
        want(builders.new_worker_pod(job, index, attempt, gang, admissions.get(names.ROLE_WORKER)))
    # The launcher waits for the watch to show every worker; an elastic one only for
    # those it starts with (a pod quota may refuse the others for a long time).
    if (missing and job.spec.elastic is None) or children.stray_launcher_pods:
        return
    if children.launcher_job is not None:
        return
    policy = job.spec.run_policy.launcher_creation_policy
    if policy == "AtStartup" or workers_ready_to_start(job, status):
        want(builders.new_launcher_job(job, attempt, admissions.get(names.ROLE_LAUNCHER)))


def gang_scheduled(job: HorovodJob, seen: Observation) -> bool:
    """Whether the workers are placed as one gang (a PodGroup the cluster serves):
    native (Auto, Native), Volcano's or scheduler-plugins' coscheduling."""
    policy = job.spec.scheduling.gang.policy
    if policy == "Volcano":
        return seen.volcano_api is True
    if policy == "Coscheduling":
        return seen.coscheduling_api is True
    return policy != "None" and seen.gang_api is True


# --- saying why a job does not progress --------------------------------------------------


def _report_progress(
    plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation
) -> None:
    """Stalled names what blocks the job; reason and message say where it is; the
    startup timeout ends a start that does not finish."""
    problems = stalled.problems(job, plan.creates, status, seen)
    if problems:
        reason, message, plan.stalled_detail = stalled.summarize(problems)
        status.conditions = set_condition(
            status.conditions, STALLED, True, reason, message, seen.now
        )
    elif not _refusal_pending(status, plan, seen):
        clear_condition(status, STALLED, REASON_PROGRESSING, seen.now)
    blocked = true_condition(status, STALLED)
    if status.phase == "Running":
        if job.spec.elastic is not None:
            status.message = elastic.waiting_message(
                job, status, stalled.waiting_workers(status, seen)
            )
        return
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
        plan.creates.clear()
        plan.config_data = None
        _delete_pods(plan, seen, None, with_launcher=True)


def _refusal_pending(status: HorovodJobStatus, plan: Plan, seen: Observation) -> bool:
    """A job Stalled by an API refusal stays so until what was refused is created: a
    restarted operator has no refusal in memory until it tries again, and clearing
    the condition meanwhile flipped it False and back (a new lastTransitionTime, a
    second Warning Event for the same refusal). The status is the durable record."""
    stalled_by = true_condition(status, STALLED)
    if stalled_by is None or stalled_by.reason not in REFUSAL_REASONS or seen.refusals:
        return False
    return any(
        stalled.refused_phrase(str(obj["kind"]), str(obj["metadata"]["name"])) in stalled_by.message
        for obj in plan.creates
    )


# --- deleting ----------------------------------------------------------------------------


# Phases a pod is still running in (cleanPodPolicy Running), and the server-side
# field selector that matches them (a field selector cannot say "in").
_UNFINISHED: Final = frozenset({"Pending", "Running"})
_UNFINISHED_FIELDS: Final = "status.phase!=Succeeded,status.phase!=Failed"
# Fewer worker pods than this to delete go one request each.
SWEEP_MIN: Final = 2


def _delete_pods(
    plan: Plan, seen: Observation, phases: frozenset[str] | None, with_launcher: bool
) -> None:
    """Delete the worker pods in `phases` (every phase: None) and the launcher, of
    what is not already going: as one sweep by label where that selects exactly
    them, else one by one."""
    children = seen.children
    workers = [
        pod
        for pod in children.workers
        if not is_terminating(pod) and (phases is None or pod_phase(pod) in phases)
    ]
    uid = str(metadata_of(seen.body).get("uid") or "")
    sweep = _worker_sweep(seen, uid, workers, phases)
    if sweep is not None:
        plan.sweeps.append(sweep)
    else:
        plan.deletes += [Delete("Pod", name_of(pod), uid=uid_of(pod)) for pod in workers]
    if with_launcher:
        launcher = children.launcher_job
        if launcher is not None and not is_terminating(launcher):
            plan.deletes.append(
                Delete("Job", name_of(launcher), "Foreground", uid=uid_of(launcher))
            )
    for pod in children.stray_launcher_pods:
        if not is_terminating(pod):
            plan.deletes.append(Delete("Pod", name_of(pod), uid=uid_of(pod)))


def _worker_sweep(
    seen: Observation, uid: str, workers: list[Mapping[str, Any]], phases: frozenset[str] | None
) -> PodSweep | None:
    """One DELETE by label for `workers`, when its selector picks no pod but theirs:
    every one carries the job's UID label (pods made before the label was added do
    not), no pod of another owner carries it, and the phases are all or unfinished."""
    if len(workers) < SWEEP_MIN or not uid or phases not in (None, _UNFINISHED):
        return None
    if any(labels_of(pod).get(names.LABEL_JOB_UID) != uid for pod in workers):
        return None
    if any(
        labels_of(pod).get(names.LABEL_JOB_UID) == uid and role_of(pod) == names.ROLE_WORKER
        for pod in seen.children.foreign.values()
    ):
        return None
    selector = ",".join(
        f"{key}={value}"
        for key, value in (
            (names.LABEL_MANAGED_BY, names.MANAGED_BY),
            (names.LABEL_ROLE, names.ROLE_WORKER),
            (names.LABEL_JOB_UID, uid),
        )
    )
    fields = "" if phases is None else _UNFINISHED_FIELDS
    return PodSweep(
        selector,
        fields,
        tuple(name_of(pod) for pod in workers),
        tuple(uid_of(pod) for pod in workers),
    )


def _force_delete_stuck_pods(plan: Plan, seen: Observation) -> None:
    """A pod still terminating well past its grace period is on a node that stopped
    answering; the pod GC would only remove it much later. Like `kubectl delete
    --force`, grace period 0 removes the object; the node, if it comes back, kills
    what is left of it."""
    waits = []
    for pod in seen.children.all_pods():
        since = metadata_of(pod).get("deletionTimestamp")
        if not since:
            continue
        overdue = (seen.now - parse_time(str(since))).total_seconds() - seen.stuck_pod_grace
        if overdue < 0:
            waits.append(-overdue + 0.5)
            continue
        node = (pod.get("spec") or {}).get("nodeName") or "no node"
        plan.deletes.append(
            Delete(
                "Pod",
                name_of(pod),
                grace_period=0,
                uid=uid_of(pod),
                warning=f"pod {name_of(pod)} was still terminating {int(overdue)}s past its "
                f"grace period (node {node} not responding); force-deleted",
            )
        )
    if waits:
        soonest = min(waits)
        if plan.requeue_after is None or soonest < plan.requeue_after:
            plan.requeue_after = soonest


def _delete_everything(plan: Plan, seen: Observation) -> None:
    children = seen.children
    _delete_pods(plan, seen, None, with_launcher=True)
    for kind, obj in (
        ("Secret", children.secret),
        ("ConfigMap", children.config_map),
        ("Service", children.service),
    ):
        if obj is not None and not is_terminating(obj):
            plan.deletes.append(Delete(kind, name_of(obj), uid=uid_of(obj)))


def _finish(plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> None:
    """cleanPodPolicy, then ttlSecondsAfterFinished."""
    failed = true_condition(status, FAILED)
    policy = job.spec.run_policy
    children = seen.children
    if failed is not None and failed.reason in _STOP_EVERYTHING:
        # Like a batch/v1 Job past its deadline: nothing of it keeps running.
        _delete_pods(plan, seen, None, with_launcher=True)
    elif policy.clean_pod_policy == "All":
        _delete_pods(plan, seen, None, with_launcher=True)
    elif policy.clean_pod_policy == "Running":
        launcher_active = any(pod_phase(pod) in _UNFINISHED for pod in children.launcher_pods)
        _delete_pods(plan, seen, _UNFINISHED, with_launcher=launcher_active)
    due = due_time(status.completion_time, policy.ttl_seconds_after_finished)
    if due is not None and seen.now >= due:
        plan.delete_job = True


# --- events and timers -------------------------------------------------------------------


def _events(
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


def _say_no_gang(plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> None:
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


def _say_uncounted_claims(plan: Plan, job: HorovodJob, seen: Observation) -> None:
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


def _requeue_for_timers(
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
