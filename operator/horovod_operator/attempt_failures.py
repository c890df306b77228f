"""A failed attempt in words and in its outcome: every failure of the attempt judged
(failures.judge, by runPolicy.podFailurePolicy), what the status keeps of them, and
the restart or failure that follows; also the checks of a world that is not the
job's and of rank 0's pod (compute_status's helper; pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from . import names
from .api import ATTEMPT_PHASES, Failure, HorovodJob, HorovodJobStatus, LauncherStatus
from .children import Children, attempt_of, deleted_workers, launcher_failures, name_of
from .conditions import (
    REASON_FAIL_JOB,
    REASON_LAUNCHER_DELETED,
    REASON_LAUNCHER_FAILED,
    REASON_POD_DELETED,
    REASON_SECRET_DELETED,
    REASON_WORKER_FAILED,
    enter_phase,
    fail,
)
from .failures import Judged, judge, outcome
from .pod_state import disruption_of, finished_at, pod_failures, pod_phase

# status.failures keeps this many (the first to fail first); the message names fewer.
MAX_FAILURES: Final = 10
MAX_NAMED: Final = 3


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


def judge_failures(
    job: HorovodJob,
    previous: HorovodJobStatus,
    children: Children,
    workers: list[Mapping[str, Any]],
    launcher: LauncherStatus | None,
    attempt: int,
    replicas: int,
) -> tuple[list[Judged], str]:
    """Every failure of the attempt, judged; and the reason to report. `replicas`:
    the worker count the attempt runs with (phases.active_replicas)."""
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
        for index in range(replicas):
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


def failed_attempt(
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
