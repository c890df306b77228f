"""The deletes of a plan: the pods of an attempt (one sweep by label where that selects
exactly them), everything of an invalid job, cleanPodPolicy and the TTL of a finished
one, and pods stuck terminating on a node that stopped answering (decide.py's
helper; pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from . import names
from .api import HorovodJob, HorovodJobStatus
from .children import is_terminating, labels_of, metadata_of, name_of, role_of, uid_of
from .conditions import (
    FAILED,
    REASON_DEADLINE,
    REASON_INVALID_SPEC,
    REASON_STARTUP_TIMEOUT,
    due_time,
    parse_time,
    true_condition,
)
from .kinds import DELETED_WHEN_INVALID
from .plan import Delete, Observation, Plan, PodSweep
from .pod_state import pod_phase

# Failures after which nothing of the job keeps running, whatever cleanPodPolicy.
_STOP_EVERYTHING: Final = frozenset({REASON_DEADLINE, REASON_INVALID_SPEC, REASON_STARTUP_TIMEOUT})


# Phases a pod is still running in (cleanPodPolicy Running), and the server-side
# field selector that matches them (a field selector cannot say "in").
_UNFINISHED: Final = frozenset({"Pending", "Running"})
_UNFINISHED_FIELDS: Final = "status.phase!=Succeeded,status.phase!=Failed"
# Fewer worker pods than this to delete go one request each.
SWEEP_MIN: Final = 2
# An elastic job's rank 0 prints its start line in a worker's own log (launchMode gloo),
# and cleanPodPolicy deletes that worker as the job ends. The progress watcher's last
# look (progress.py) gets this long after the end to read it first: the kind rung's
# elastic example twice ended between two looks of a watcher backing off, and its
# workers were gone before the last one, so no status.firstStepTime.
FIRST_STEP_LOOK_S: Final = 10.0


def delete_pods(
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


def force_delete_stuck_pods(plan: Plan, seen: Observation) -> None:
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


def delete_everything(plan: Plan, seen: Observation) -> None:
    delete_pods(plan, seen, None, with_launcher=True)
    for kind in DELETED_WHEN_INVALID:
        obj = seen.children.one_of(kind)
        if obj is not None and not is_terminating(obj):
            plan.deletes.append(Delete(kind, name_of(obj), uid=uid_of(obj)))


def finish(plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation) -> None:
    """cleanPodPolicy, then ttlSecondsAfterFinished."""
    failed = true_condition(status, FAILED)
    policy = job.spec.run_policy
    children = seen.children
    if failed is not None and failed.reason in _STOP_EVERYTHING:
        # Like a batch/v1 Job past its deadline: nothing of it keeps running.
        delete_pods(plan, seen, None, with_launcher=True)
    elif policy.clean_pod_policy != "None" and _awaits_first_step(plan, job, status, seen):
        pass  # cleaned up at the requeue, or once the watcher wrote the first step
    elif policy.clean_pod_policy == "All":
        delete_pods(plan, seen, None, with_launcher=True)
    elif policy.clean_pod_policy == "Running":
        launcher_active = any(pod_phase(pod) in _UNFINISHED for pod in children.launcher_pods)
        delete_pods(plan, seen, _UNFINISHED, with_launcher=launcher_active)
    due = due_time(status.completion_time, policy.ttl_seconds_after_finished)
    if due is not None and seen.now >= due:
        plan.delete_job = True


def _awaits_first_step(
    plan: Plan, job: HorovodJob, status: HorovodJobStatus, seen: Observation
) -> bool:
    """Whether to keep an elastic job's pods a little longer for the progress watcher's
    last look at rank 0's line (FIRST_STEP_LOOK_S); requeues for the end of the wait."""
    if job.spec.elastic is None or status.first_step_time or not status.completion_time:
        return False
    end = parse_time(status.completion_time) + timedelta(seconds=FIRST_STEP_LOOK_S)
    left = (end - seen.now).total_seconds()
    if left <= 0:
        return False
    if plan.requeue_after is None or left < plan.requeue_after:
        plan.requeue_after = left
    return True
