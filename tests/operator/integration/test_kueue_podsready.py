"""Kueue with waitForPodsReady (on by default since Kueue v0.19): the real Kueue
v0.17 configured with it, short timeouts, the real kube-scheduler, kwok nodes.

Kueue evicts an admitted Workload whose PodsReady condition is not True within
`timeout` of its admission (or within `recoveryTimeout` of turning False after
a failure). For a Workload an external controller creates, only that
controller writes the condition: these tests prove that the operator keeps it
as Kueue's own job framework does, so a job that started is never evicted, and
one that cannot start is evicted, requeued with backoff, and says why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from localcluster.kueue import KueueProcess
from tests.support.cluster import KubeCluster
from tests.support.kueue import (
    POOL_LABEL,
    WORKLOADS,
    gpu_queue,
    kueue_process,
    queued_job,
    workload_condition,
    workload_of,
)
from tests.support.operator import Jobs

TIMEOUT: Final = 8  # seconds: waitForPodsReady.timeout
RECOVERY: Final = 6  # seconds: waitForPodsReady.recoveryTimeout
BLOCKED: Final = "horovod.ai/test-blocked"


@pytest.fixture(scope="module")
def kueue(cluster: KubeCluster) -> Iterator[KueueProcess]:
    settings = {
        "timeout": f"{TIMEOUT}s",
        "recoveryTimeout": f"{RECOVERY}s",
        "blockAdmission": True,
        "requeuingStrategy": {
            "timestamp": "Eviction",
            "backoffBaseSeconds": 2,
            "backoffMaxSeconds": 10,
        },
    }
    with kueue_process(cluster, "kueue-podsready", wait_for_pods_ready=settings) as process:
        yield process


@pytest.fixture
def queue(kueue: KueueProcess, cluster: KubeCluster, namespace: str) -> Iterator[str]:
    with gpu_queue(cluster, namespace) as name:
        yield name


def _pods_ready(cluster: KubeCluster, namespace: str, job: str) -> tuple[str, str] | None:
    """The job's Workload's PodsReady (status, reason); None before either exists."""
    found = cluster.get(WORKLOADS, namespace=namespace, selector=f"horovod.ai/job-name={job}")
    if not found["items"]:
        return None
    condition = workload_condition(found["items"][0], "PodsReady")
    return None if condition is None else (condition["status"], condition["reason"])


def _evictions(jobs: Jobs, name: str) -> list[str]:
    return [e["message"] for e in jobs.events(name) if e["reason"] == "EvictedByKueue"]


def _pool_nodes(cluster: KubeCluster, namespace: str) -> list[str]:
    nodes = cluster.get("nodes", selector=f"{POOL_LABEL}={namespace}")["items"]
    return [n["metadata"]["name"] for n in nodes]


def test_a_job_that_starts_in_time_trains_past_several_timeouts(
    queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    jobs.apply(queued_job("steady", 1, queue))
    jobs.wait_running("steady", timeout=60)
    jobs.op.wait(
        lambda: _pods_ready(cluster, namespace, "steady") == ("True", "Started"),
        20,
        "the Workload's PodsReady True (Started)",
    )
    written = workload_condition(workload_of(cluster, namespace, "steady"), "PodsReady")
    # Three timeouts later: still Running, never evicted, the condition written once.
    jobs.op.stays(
        lambda: jobs.status("steady").get("phase") == "Running" and not _evictions(jobs, "steady"),
        3 * TIMEOUT,
        "steady Running and never evicted",
    )
    assert workload_condition(workload_of(cluster, namespace, "steady"), "PodsReady") == written
    # An operator restart re-derives the condition and writes nothing new.
    jobs.op.stop()
    jobs.op.start()
    jobs.op.stays(
        lambda: jobs.status("steady").get("phase") == "Running" and not _evictions(jobs, "steady"),
        TIMEOUT + 2,
        "steady Running after the operator's restart",
    )
    assert workload_condition(workload_of(cluster, namespace, "steady"), "PodsReady") == written
    status = jobs.status("steady")
    assert (status["restarts"], status.get("uncountedRestarts", 0)) == (0, 0), status


def test_a_job_that_cannot_start_in_time_is_evicted_requeued_and_says_why(
    queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    # Inside the quota, but no node has the label its workers ask for.
    manifest = queued_job("stuck", 1, queue)
    manifest["spec"]["worker"]["template"] = {"spec": {"nodeSelector": {BLOCKED: "nowhere"}}}
    jobs.apply(manifest)
    jobs.op.wait(
        lambda: _pods_ready(cluster, namespace, "stuck") == ("False", "WaitForStart"),
        60,
        "the Workload's PodsReady False (WaitForStart)",
    )
    evicted = jobs.op.wait(lambda: _evictions(jobs, "stuck"), TIMEOUT + 30, "stuck evicted")
    assert "PodsReadyTimeout" in evicted[0], evicted
    assert "Exceeded the PodsReady timeout" in evicted[0], evicted
    suspended = jobs.wait_phase("stuck", "Suspended")
    assert suspended["reason"] in ("EvictedByKueue", "QueuedByKueue"), suspended
    # Kueue counts the eviction and requeues it after its backoff; admitted again, the
    # job starts a new attempt: the eviction is no failure.
    stats = workload_of(cluster, namespace, "stuck")["status"].get("schedulingStats") or {}
    causes = {(e["reason"], e.get("underlyingCause")) for e in stats.get("evictions") or ()}
    assert ("PodsReadyTimeout", "WaitForStart") in causes, stats

    def readmitted() -> dict[str, Any] | None:
        status = jobs.status("stuck")
        return status if status.get("restarts", 0) >= 1 and jobs.pods("stuck") else None

    status = jobs.op.wait(readmitted, 60, "stuck admitted again with new pods")
    assert status["restarts"] == status["uncountedRestarts"], status
    assert jobs.condition("stuck", "Failed") is None
    assert {p["metadata"]["labels"]["horovod.ai/attempt"] for p in jobs.pods("stuck")} <= {
        str(status["restarts"])
    }


def test_a_restart_after_a_worker_failure_runs_on_the_recovery_timeout(
    queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    manifest = queued_job("recovers", 1, queue)
    manifest["spec"]["runPolicy"]["backoffLimit"] = 3
    jobs.apply(manifest)
    jobs.wait_running("recovers", timeout=60)
    jobs.op.wait(
        lambda: _pods_ready(cluster, namespace, "recovers") == ("True", "Started"),
        20,
        "PodsReady True (Started)",
    )
    # A worker fails: the attempt restarts, and its new pods can go nowhere.
    nodes = _pool_nodes(cluster, namespace)
    for node in nodes:
        cluster.kubectl("taint", "node", node, f"{BLOCKED}=yes:NoSchedule")
    worker = jobs.pods("recovers")[0]["metadata"]["name"]
    cluster.set_pod_phase(namespace, worker, "Failed", exit_code=1)
    jobs.op.wait(
        lambda: _pods_ready(cluster, namespace, "recovers") == ("False", "WaitForRecovery"),
        30,
        "PodsReady False (WaitForRecovery)",
    )
    # Kueue times the recovery from that transition (recoveryTimeout, not timeout).
    evicted = jobs.op.wait(lambda: _evictions(jobs, "recovers"), RECOVERY + 30, "recovers evicted")
    assert "PodsReadyTimeout" in evicted[0], evicted
    stats = workload_of(cluster, namespace, "recovers")["status"].get("schedulingStats") or {}
    causes = {(e["reason"], e.get("underlyingCause")) for e in stats.get("evictions") or ()}
    assert ("PodsReadyTimeout", "WaitForRecovery") in causes, stats

    # The nodes take pods again: readmitted after the backoff, it starts afresh.
    for node in nodes:
        cluster.kubectl("taint", "node", node, f"{BLOCKED}-")
    jobs.op.wait(
        lambda: (
            jobs.status("recovers").get("phase") == "Running"
            and _pods_ready(cluster, namespace, "recovers") == ("True", "Started")
        ),
        90,
        "recovers Running again with PodsReady True",
    )
    status = jobs.status("recovers")
    # One counted failure (the worker), one uncounted restart (the eviction).
    assert status["restarts"] - status["uncountedRestarts"] == 1, status
