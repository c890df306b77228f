"""An elastic job's workers: each lost one replaced, counted once, named; its size reported.

Pure, called by decide.py for an elastic job whose attempt runs (Pending,
Starting, Running). The attempt does not end when a worker is lost: Horovod's
driver in the launcher goes on with the others (docs/elastic.md). Here:

- a worker pod that failed is deleted, so that _ensure_children creates its
  replacement under the same name (a new pod, which Horovod takes as a new
  host); one deleted by someone else is replaced once it is gone;
- each loss is recorded once (by pod UID) in status.elastic.lostWorkers with
  its reason, and posted as a WorkerLost Event. A pod seen failed or
  terminating is recorded then; one that vanished between two looks (a forced
  deletion, a watch that skipped its last states, an operator restart) is
  found missing from status.elastic.workerUids, the pods of the attempt last
  seen (a worker never created, under a pod quota, is not lost). A failure is judged by
  runPolicy.podFailurePolicy like any other: FailJob fails the job, a counted
  failure adds to status.elastic.workerFailures, and past backoffLimit the job
  fails (a worker that crashes at every start cannot loop forever); deletions,
  evictions and preemptions are not counted;
- the Ready workers, which are the hosts the driver trains on, are
  status.elastic.workers; each change while Running is a Resized Event.
"""

from __future__ import annotations

from typing import Final

from .api import ElasticStatus, HorovodJob, HorovodJobStatus, LostWorker
from .children import attempt_of, is_terminating, name_of, uid_of
from .conditions import REASON_POD_DELETED, REASON_RESIZED, REASON_WORKER_LOST, format_time
from .failures import judge, outcome
from .plan import Delete, Event, Observation
from .pod_state import disruption_of, pod_failures, pod_phase

# Lost workers kept in the status (the count is kept whole).
KEPT_LOSSES: Final = 20
# The characters of a pod UID kept in status.elastic.workerUids: enough to tell a
# pod from its replacement, small enough for maxReplicas entries in the status.
UID_KEPT: Final = 8


def track(
    job: HorovodJob,
    previous: HorovodJobStatus | None,
    status: HorovodJobStatus,
    seen: Observation,
) -> tuple[list[Event], tuple[str, str] | None]:
    """The Events to post, and (reason, message) if the job must fail. Updates
    status.elastic in place (compute_status's helper)."""
    assert job.spec.elastic is not None
    tracked = (status.elastic or ElasticStatus()).model_copy(deep=True)
    if tracked.attempt != status.restarts:
        tracked.attempt, tracked.worker_uids = status.restarts, {}
    recorded = {loss.uid[:UID_KEPT] for loss in tracked.lost_workers}
    events: list[Event] = []
    fatal: tuple[str, str] | None = None
    rules = job.spec.run_policy.pod_failure_policy
    now = format_time(seen.now)
    current = [pod for pod in seen.children.workers if attempt_of(pod) == status.restarts]
    present = {name_of(pod): uid_of(pod)[:UID_KEPT] for pod in current}
    for name, uid in tracked.worker_uids.items():
        if present.get(name) == uid or uid in recorded:
            continue
        tracked.lost_workers.append(
            LostWorker(pod=name, uid=uid, reason=REASON_POD_DELETED, time=now,
                       message="the pod disappeared while the job ran")
        )  # fmt: skip
        events.append(_lost_event(job, name, REASON_POD_DELETED, "a disruption is not counted"))
    tracked.worker_uids = present
    for pod in current:
        failed = pod_phase(pod) == "Failed" and not is_terminating(pod)
        if uid_of(pod)[:UID_KEPT] in recorded or not (failed or is_terminating(pod)):
            continue
        if failed:
            decisive = outcome(judge(pod, f, disruption_of(pod), rules) for f in pod_failures(pod))
            assert decisive is not None
            failure, action, why = decisive.failure, decisive.action, decisive.why
        else:
            reason = disruption_of(pod) or REASON_POD_DELETED
            failure = pod_failures(pod)[0].model_copy(
                update={"reason": reason, "message": "deleted while the job ran"}
            )
            action, why = "Ignore", f"a disruption ({reason}) is not counted"
        counted = action == "Count"
        tracked.lost_workers.append(
            LostWorker(
                pod=name_of(pod),
                uid=uid_of(pod),
                reason=failure.reason,
                exit_code=failure.exit_code,
                message=failure.message,
                time=now,
                counted=counted,
            )
        )
        tracked.worker_failures += int(counted)
        detail = ", ".join(
            part
            for part in (
                failure.reason,
                f"exit code {failure.exit_code}" if failure.exit_code is not None else "",
            )
            if part
        )
        if action == "FailJob":
            fatal = (REASON_WORKER_LOST, f"worker pod {name_of(pod)} failed ({detail}); {why}")
            continue
        events.append(_lost_event(job, name_of(pod), detail, why))
    limit = job.spec.run_policy.backoff_limit
    if fatal is None and tracked.worker_failures > limit:
        fatal = (
            REASON_WORKER_LOST,
            f"{tracked.worker_failures} worker pods failed, more than backoffLimit ({limit}); "
            f"the last: {tracked.lost_workers[-1].pod} ({tracked.lost_workers[-1].reason})",
        )
    tracked.lost_workers = tracked.lost_workers[-KEPT_LOSSES:]
    ready = status.workers.ready if status.workers else 0
    before = previous.elastic.workers if previous and previous.elastic else None
    if status.phase == "Running" and before is not None and ready != before:
        tracked.resizes += 1
        tracked.last_resize_time = now
        events.append(
            Event(
                "Normal",
                REASON_RESIZED,
                f"{ready} worker(s) ready, was {before}: the training goes on with them from "
                f"its next commit (elastic {job.spec.elastic.min_replicas}.."
                f"{job.spec.elastic.max_replicas})",
            )
        )
    tracked.workers = ready
    status.elastic = tracked
    return events, fatal


def failed_pods(status: HorovodJobStatus, seen: Observation) -> list[Delete]:
    """The attempt's failed worker pods, deleted so that their places are made again
    (track has recorded them)."""
    return [
        Delete("Pod", name_of(pod), uid=uid_of(pod))
        for pod in seen.children.workers
        if attempt_of(pod) == status.restarts
        and pod_phase(pod) == "Failed"
        and not is_terminating(pod)
    ]


def _lost_event(job: HorovodJob, pod: str, detail: str, why: str) -> Event:
    assert job.spec.elastic is not None
    return Event(
        "Warning",
        REASON_WORKER_LOST,
        f"worker pod {pod} lost ({detail}; {why}): replaced, and the job goes on with the "
        f"others (elastic.minReplicas {job.spec.elastic.min_replicas})",
    )


def waiting_message(job: HorovodJob, status: HorovodJobStatus, stuck: list[str]) -> str:
    """A running elastic job's status.message: its size and what the others wait for."""
    assert job.spec.elastic is not None
    ready = status.workers.ready if status.workers else 0
    message = (
        f"training with {ready} of {job.spec.elastic.max_replicas} worker(s) ready "
        f"(elastic {job.spec.elastic.min_replicas}..{job.spec.elastic.max_replicas})"
    )
    if stuck:
        message += "; waiting: " + "; ".join(stuck[:3])
    return message
