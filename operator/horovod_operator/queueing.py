"""Kueue admission: a HorovodJob with a queue is admitted as one Workload.

When `spec.scheduling.queue` is set and the cluster serves
kueue.x-k8s.io/v1beta2 Workload, the job gets one Workload (its pod sets: the
workers and the launcher) and no pod exists until Kueue admits it. This is
what Kueue's job framework does for the kinds it knows, done by the operator
for its own kind (Kueue's Configuration names HorovodJob among its
externalFrameworks): create the Workload, start the job on admission with the
admitted flavors' node labels and tolerations, stop it when the Workload is
evicted and then clear the admission so that it queues again, and mark the
Workload Finished when the job ends, which releases its quota.

Pure: the job, what it controls and the ResourceFlavors in; a :class:`Gate` out
(whether the job waits and why, the Workload to create, the status to write
to it, where its pods go).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from . import builders, multikueue, names
from .api import HorovodJob, HorovodJobStatus
from .children import (
    Children,
    metadata_of,
    name_of,
    workload_condition,
    workload_finished,
    workload_true,
)
from .conditions import (
    REASON_CHILD_CONFLICT,
    REASON_EVICTED_BY_KUEUE,
    REASON_PRIORITY_CLASS_NOT_FOUND,
    REASON_QUEUED_BY_KUEUE,
    REASON_WORKLOAD_FINISHED,
    format_time,
)
from .kueue_admission import pod_set_admissions
from .plan import Obj, Observation, WorkloadAdoption, WorkloadStatusPatch

# Workload condition types and reasons (sigs.k8s.io/kueue/apis/kueue/v1beta2).
QUOTA_RESERVED: Final = "QuotaReserved"
ADMITTED: Final = "Admitted"
EVICTED: Final = "Evicted"
FINISHED: Final = "Finished"
REQUEUED: Final = "Requeued"
PODS_READY: Final = "PodsReady"
# PodsReady reasons, as Kueue's job framework writes them (generatePodsReadyCondition).
WAIT_FOR_START: Final = "WaitForStart"
WAIT_FOR_RECOVERY: Final = "WaitForRecovery"
STARTED: Final = "Started"
RECOVERED: Final = "Recovered"
_PODS_READY_MESSAGES: Final = {
    WAIT_FOR_START: "Not every worker pod is Ready, or the launcher is not running yet",
    WAIT_FOR_RECOVERY: "An attempt of the job failed; waiting for the next attempt's pods",
    STARTED: "Every worker pod is Ready and the launcher is running",
    RECOVERED: "The job started again after a failed attempt: every worker pod is Ready",
}
# Evictions after which Kueue's job framework marks the Workload Requeued=True.
_REQUEUED_EVICTIONS: Final = frozenset({"Preempted", "NodeFailures"})
# How soon to look again for a priority class or flavor that was not there.
RETRY_SECONDS: Final = 5.0


def managed(job: HorovodJob, seen: Observation) -> bool:
    """Whether Kueue admits this job (a queue, and a cluster that serves Workloads)."""
    # With gang.policy Volcano the queue is Volcano's (podgroups.py).
    volcano = job.spec.scheduling.gang.policy == "Volcano"
    return bool(job.spec.scheduling.queue) and seen.kueue_api is True and not volcano


@dataclass(frozen=True)
class Gate:
    """What the job's Workload means for the job now."""

    # (reason, message): the job waits, Suspended, with no pods. None: admitted.
    hold: tuple[str, str] | None = None
    # Where each pod set's pods go (admitted and every flavor read); None: create no pod.
    admissions: Mapping[str, builders.Admission] | None = None
    create: dict[str, Any] | None = None
    patch: WorkloadStatusPatch | None = None
    adopt: WorkloadAdoption | None = None
    requeue_after: float | None = None


def gate(job: HorovodJob, seen: Observation, attempt: int) -> Gate:
    children = seen.children
    workload = children.workload
    queue = job.spec.scheduling.queue
    prebuilt = multikueue.prebuilt_workload(job.metadata.labels)
    if prebuilt is not None:
        # MultiKueue's copy on a worker cluster: that Workload only, never our own.
        if workload is None or name_of(workload) != prebuilt:
            hold, adopt = multikueue.wait_or_adopt(job, children, prebuilt)
            return Gate(hold=hold, adopt=adopt)
    else:
        name = names.workload_name(job.metadata.name, attempt)
        if workload is None or (workload_finished(workload) and name_of(workload) != name):
            return _create(job, seen, attempt, name)
    wl_name = name_of(workload)
    if workload_finished(workload):
        finished = workload_condition(workload, FINISHED) or {}
        # MultiKueue's copy has no Workload of its own to queue again: MultiKueue deletes it.
        then = "Delete the Workload to queue it again"
        if prebuilt:
            then = "MultiKueue deletes this copy"
        return Gate(
            hold=(
                REASON_WORKLOAD_FINISHED,
                f"Kueue finished Workload {wl_name} ({finished.get('reason')}: "
                f"{finished.get('message')}) although the job has not; it waits. {then}",
            )
        )
    if workload_true(workload, EVICTED) and workload_true(workload, QUOTA_RESERVED):
        evicted = workload_condition(workload, EVICTED) or {}
        hold = (
            REASON_EVICTED_BY_KUEUE,
            f"Kueue evicted Workload {wl_name} ({evicted.get('reason')}: "
            f"{evicted.get('message')}); the pods are deleted and the job queues again",
        )
        if children.all_pods() or children.launcher_job is not None:
            return Gate(hold=hold)  # the quota stays reserved until the pods are gone
        return Gate(hold=hold, patch=_requeue_patch(workload, evicted, seen.now))
    if workload_true(workload, ADMITTED):
        admissions = pod_set_admissions(workload, seen.flavors)
        return Gate(admissions=admissions, requeue_after=None if admissions else RETRY_SECONDS)
    return Gate(hold=(REASON_QUEUED_BY_KUEUE, _queued_message(workload, str(queue))))


def _create(job: HorovodJob, seen: Observation, attempt: int, name: str) -> Gate:
    queue = job.spec.scheduling.queue
    wanted_class = job.spec.scheduling.priority_class_name
    if wanted_class and seen.priority is None:
        return Gate(
            hold=(
                REASON_PRIORITY_CLASS_NOT_FOUND,
                f"spec.scheduling.priorityClassName {wanted_class!r} names neither a Kueue "
                f"WorkloadPriorityClass nor a PriorityClass; the job's Workload is created "
                f"once it exists",
            ),
            requeue_after=RETRY_SECONDS,
        )
    other = seen.children.foreign.get(name)
    if other is not None:
        return Gate(
            hold=(
                REASON_CHILD_CONFLICT,
                f"Workload {name} already exists and is not this job's; the job waits for it to go",
            )
        )
    return Gate(
        hold=(
            REASON_QUEUED_BY_KUEUE,
            f"Workload {name} is created in queue {queue}; waiting for Kueue to admit it",
        ),
        create=builders.new_workload(job, attempt, seen.priority),
    )


def _queued_message(workload: Obj, queue: str) -> str:
    name = name_of(workload)
    reserved = workload_condition(workload, QUOTA_RESERVED)
    if reserved is None:
        detail = "not considered by Kueue yet"
    elif reserved.get("status") == "True":
        detail = "quota reserved; waiting for its admission checks"
    else:
        detail = str(reserved.get("message") or reserved.get("reason") or "pending")
        detail += _topology_note(workload)
    status = workload.get("status") or {}
    requeue = status.get("requeueState") or {}
    checks = status.get("admissionChecks") or ()
    rejected = next((c for c in checks if c.get("state") == "Rejected"), None)
    if rejected is not None:
        # Kueue deactivates it for good: spec.active back to true is rejected again.
        detail = (
            f"admission check {rejected.get('name')} rejected it ({rejected.get('message')}). "
            f"Fix what the check asks, in a new job, or use a queue without that check"
        )
    elif (workload.get("spec") or {}).get("active") is False:
        # waitForPodsReady's requeuingBackoffLimitCount reached, or an admin's doing.
        requeued = workload_condition(workload, REQUEUED) or {}
        why = requeued.get("message") or requeued.get("reason") or "spec.active is false"
        detail = (
            f"Kueue deactivated it ({why}) and does not admit it again until its "
            f"spec.active is true (kubectl patch workload {name} --type=merge "
            f'-p \'{{"spec":{{"active":true}}}}\'), or the HorovodJob is deleted'
        )
    elif requeue.get("requeueAt"):
        detail += (
            f"; Kueue queues it again after its backoff, at {requeue['requeueAt']} "
            f"(eviction {requeue.get('count') or 1})"
        )
    return f"Workload {name} waits in queue {queue} for Kueue to admit it: {detail}"


def _topology_note(workload: Obj) -> str:
    """What a Required topology asks, for a Workload Kueue cannot place yet: Kueue's
    message names the last pod set it tried (often the launcher, "no TAS flavor")."""
    for pod_set in (workload.get("spec") or {}).get("podSets") or ():
        key = (pod_set.get("topologyRequest") or {}).get("required")
        if key:
            return (
                f" (spec.scheduling.topology Required: its {pod_set.get('count')} "
                f"{pod_set.get('name')} pods must fit in one {key} domain; Preferred lets "
                f"them spread)"
            )
    return ""


def admitted_flavors(workload: Obj | None) -> list[str]:
    """The ResourceFlavors an admitted Workload names (for the executor to read)."""
    if workload is None or not workload_true(workload, ADMITTED):
        return []
    assignments = ((workload.get("status") or {}).get("admission") or {}).get(
        "podSetAssignments"
    ) or ()
    return sorted({f for a in assignments for f in (a.get("flavors") or {}).values()})


# --- writing the Workload's status -------------------------------------------------------


def set_workload_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[dict[str, Any]]:
    """metav1.Condition semantics: lastTransitionTime moves only with the status."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type_), None)
    since = format_time(now)
    if previous is not None and previous.get("status") == value:
        since = str(previous.get("lastTransitionTime") or since)
    updated = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
    if previous is None:
        return [*conditions, updated]
    return [updated if c.get("type") == type_ else c for c in conditions]


def _conditions(workload: Obj) -> list[dict[str, Any]]:
    return [dict(c) for c in (workload.get("status") or {}).get("conditions") or ()]


def _generation(workload: Obj) -> int:
    return int(metadata_of(workload).get("generation") or 0)


def _requeue_patch(workload: Obj, evicted: Mapping[str, Any], now: datetime) -> WorkloadStatusPatch:
    """What Kueue's job framework writes once an evicted job's pods are gone
    (jobframework.ReconcileGenericJob, step "handle eviction"): Requeued (True after
    a preemption or node failures), QuotaReserved False with reason Pending, no
    admission, and Admitted False. Kueue then queues the Workload again."""
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "")
    generation = _generation(workload)
    conditions = _conditions(workload)
    conditions = set_workload_condition(
        conditions, REQUEUED, reason in _REQUEUED_EVICTIONS, reason, message, now, generation
    )
    conditions = set_workload_condition(
        conditions, QUOTA_RESERVED, False, "Pending", message, now, generation
    )
    conditions = set_workload_condition(
        conditions,
        ADMITTED,
        False,
        "NoReservation",
        "The workload has no reservation",
        now,
        generation,
    )
    if workload_condition(workload, PODS_READY) is not None:
        # Not admitted any more: the next admission waits for its pods from the start.
        conditions = set_workload_condition(
            conditions,
            PODS_READY,
            False,
            WAIT_FOR_START,
            _PODS_READY_MESSAGES[WAIT_FOR_START],
            now,
            generation,
        )
    return WorkloadStatusPatch(
        name=name_of(workload),
        resource_version=str(metadata_of(workload).get("resourceVersion") or ""),
        conditions=conditions,
        clear_admission=True,
        summary="admission cleared, queued again",
    )


def finished_patch(
    children: Children, status: HorovodJobStatus, now: datetime
) -> WorkloadStatusPatch | None:
    """The job ended: its Workload Finished (Succeeded or Failed), so Kueue releases
    the quota, as it does for the jobs it runs itself."""
    workload = children.workload
    if workload is None or workload_finished(workload):
        return None
    reason = "Succeeded" if status.phase == "Succeeded" else "Failed"
    message = status.message or f"the HorovodJob {status.phase}"
    conditions = set_workload_condition(
        _conditions(workload), FINISHED, True, reason, message, now, _generation(workload)
    )
    return WorkloadStatusPatch(
        name=name_of(workload),
        resource_version=str(metadata_of(workload).get("resourceVersion") or ""),
        conditions=conditions,
        summary=f"Finished ({reason})",
    )


# --- PodsReady: what Kueue's waitForPodsReady reads ----------------------------------------


def pods_started(job: HorovodJob, status: HorovodJobStatus) -> bool:
    """Kueue's "pods ready" for a HorovodJob: the attempt runs (the launcher is
    running, or for gloo its rendezvous is over) and every worker pod is Ready or
    done; an elastic job needs minReplicas of them, the size it can train at."""
    workers = status.workers
    if status.phase != "Running" or workers is None or workers.replicas <= 0:
        return False
    elastic = job.spec.elastic
    needed = elastic.min_replicas if elastic is not None else workers.replicas
    return workers.ready + workers.succeeded >= needed


def pods_ready_condition(workload: Obj, started: bool) -> tuple[bool, str]:
    """The Workload's PodsReady (status, reason) as Kueue's job framework derives it
    for the jobs it runs itself: WaitForStart until the admitted job first starts,
    Started then, WaitForRecovery once a started job stops being ready (a failed
    attempt restarting), Recovered when it is ready again. Kueue's waitForPodsReady
    times WaitForStart from the admission and WaitForRecovery from this condition's
    transition (its recoveryTimeout)."""
    current = workload_condition(workload, PODS_READY)
    reason = str((current or {}).get("reason") or "")
    if not workload_true(workload, ADMITTED):
        return False, WAIT_FOR_START
    if started:
        return True, RECOVERED if reason in (WAIT_FOR_RECOVERY, RECOVERED) else STARTED
    if current is None:
        return False, WAIT_FOR_START
    if current.get("status") == "True" or reason == WAIT_FOR_RECOVERY:
        return False, WAIT_FOR_RECOVERY
    return False, WAIT_FOR_START


def pods_ready_patch(
    workload: Obj | None, started: bool, now: datetime
) -> WorkloadStatusPatch | None:
    """The PodsReady write this Workload needs, or None when it says so already
    (written once per change: Kueue compares status and reason, so do we)."""
    if workload is None or workload_finished(workload) or workload_true(workload, EVICTED):
        return None  # an evicted Workload's conditions are written with its requeue
    current = workload_condition(workload, PODS_READY) or {}
    if not current and not workload_true(workload, ADMITTED):
        return None  # queued: nothing to time yet, and no write to spend
    ready, reason = pods_ready_condition(workload, started)
    if current.get("status") == ("True" if ready else "False") and current.get("reason") == reason:
        return None
    conditions = set_workload_condition(
        _conditions(workload),
        PODS_READY,
        ready,
        reason,
        _PODS_READY_MESSAGES[reason],
        now,
        _generation(workload),
    )
    return WorkloadStatusPatch(
        name=name_of(workload),
        resource_version=str(metadata_of(workload).get("resourceVersion") or ""),
        conditions=conditions,
        summary=f"PodsReady {ready} ({reason})",
    )
