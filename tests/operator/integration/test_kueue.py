"""Kueue admits HorovodJobs as whole Workloads: the real Kueue v0.17 (with its
webhooks, which the API server calls) and the real kube-scheduler, GPUs on kwok
nodes. Queueing on quota, flavors placing the pods, priority preemption that
suspends (not fails) the lower job, and quota released when a job finishes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from horovod_operator.kube import Kube
from localcluster.kueue import KueueProcess
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

POOL_LABEL = "horovod.ai/test-pool"
WORKLOADS = "workloads.kueue.x-k8s.io"


@pytest.fixture(scope="module")
def kueue(cluster: KubeCluster) -> Iterator[KueueProcess]:
    """Kueue with its CRDs and webhooks, once for this module (before the operator
    of each test starts, so that it detects the Workload API). Its webhooks go
    before it stops, and its CRDs after, so later tests see a cluster without it."""
    process = KueueProcess(
        cluster.kubeconfig,
        cluster.kubectl,
        cluster.layout.pki,
        cluster.layout.root / "kueue",
        cluster.logs_dir / "kueue.log",
    )
    try:
        seconds = process.start()
        print(f"Kueue (pid {process.pid}) ready with its webhooks in {seconds:.1f}s")
        yield process
    finally:
        print(f"--- Kueue log ---\n{process.tail(40)}")
        process.stop()
        process.uninstall_crds()


@pytest.fixture
def queue(kueue: KueueProcess, cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """A LocalQueue `gpus` in the test's namespace, of a ClusterQueue with 8 GPUs of
    one ResourceFlavor whose nodes are two tainted kwok nodes of 8 GPUs that only
    this test's flavor leads to (16 GPUs there: the quota, not the nodes, limits)."""
    nodes = cluster.add_kwok_nodes(2, 8, prefix=f"{namespace[:40]}-")
    flavor = cluster_queue = namespace
    try:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}={namespace}")
            cluster.kubectl("taint", "node", node, f"{POOL_LABEL}={namespace}:NoSchedule")
        cluster.wait_nodes_ready()
        for obj in (
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {
                    "nodeLabels": {POOL_LABEL: namespace},
                    "tolerations": [
                        {
                            "key": POOL_LABEL,
                            "operator": "Equal",
                            "value": namespace,
                            "effect": "NoSchedule",
                        }
                    ],
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": flavor,
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "gpus", "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ):
            cluster.apply(obj)
        yield "gpus"
    finally:
        cluster.kubectl(
            "delete", "localqueue", "gpus", "-n", namespace, "--wait=false", check=False
        )
        cluster.kubectl("delete", "clusterqueue", cluster_queue, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def _job(name: str, gpus: int, queue: str, priority: str | None = None) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"queue": queue}
    if priority:
        scheduling["priorityClassName"] = priority
    manifest = hvjob(name, replicas=2, scheduling=scheduling)
    manifest["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return manifest


def _workload(cluster: KubeCluster, namespace: str, job: str) -> dict[str, Any]:
    """The job's Workload, read through the API (what `kubectl get workloads` lists)."""
    items = cluster.get(WORKLOADS, namespace=namespace, selector=f"horovod.ai/job-name={job}")
    assert len(items["items"]) == 1, items
    found: dict[str, Any] = items["items"][0]
    return found


def _wl_true(workload: dict[str, Any], type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True"
        for c in workload.get("status", {}).get("conditions", [])
    )


def _live(jobs: Jobs, name: str, role: str = "worker") -> list[dict[str, Any]]:
    return [p for p in jobs.pods(name, role) if not p["metadata"].get("deletionTimestamp")]


def _on_pool(jobs: Jobs, name: str, namespace: str) -> None:
    """The job's workers went where their flavor says: its node label, its toleration.
    (The launcher requests no resource, so Kueue assigns its pod set no flavor.)"""
    for pod in _live(jobs, name):
        assert pod["spec"]["nodeSelector"] == {POOL_LABEL: namespace}, pod["spec"]
        flavor_toleration = {"key": POOL_LABEL, "operator": "Equal", "value": namespace}
        assert any(flavor_toleration.items() <= t.items() for t in pod["spec"]["tolerations"])
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
        node = pod["spec"].get("nodeName")
        assert node and node.startswith(namespace[:40]), (pod["metadata"]["name"], node)


def test_three_jobs_on_eight_gpus_two_run_and_the_third_waits_whole(
    kueue: KueueProcess, queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    names = ("first", "second", "third")
    for name in names:
        jobs.apply(_job(name, 2, queue))  # 2 workers x 2 GPUs each: two fit in 8

    def running() -> list[str] | None:
        up = [n for n in names if jobs.status(n).get("phase") == "Running"]
        return up if len(up) == 2 else None

    admitted = jobs.op.wait(running, 90, "two jobs Running")
    waiting = next(n for n in names if n not in admitted)
    status = jobs.wait_phase(waiting, "Suspended")
    assert status["reason"] == "QueuedByKueue", status
    assert f"hvjob-{waiting}-0 waits in queue {queue}" in status["message"], status
    jobs.op.wait(
        lambda: "insufficient unused quota" in jobs.status(waiting).get("message", ""),
        30,
        "Kueue's own reason in the waiting job's message",
    )
    assert jobs.pods(waiting) == [] and jobs.pods(waiting, "launcher") == []
    # What a user sees (docs/kueue.md quotes it).
    for kind in ("hj", WORKLOADS):
        print(cluster.kubectl("get", kind, "-n", namespace).stdout)
    print(f"{waiting}: {jobs.status(waiting)['message']}")
    for name in admitted:
        _on_pool(jobs, name, namespace)
        workload = _workload(cluster, namespace, name)
        assert _wl_true(workload, "Admitted"), workload["status"]
        assert workload["metadata"]["ownerReferences"][0]["uid"] == jobs.uid(name)
        assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
            ("worker", 2),
            ("launcher", 1),
        ]
    assert not _wl_true(_workload(cluster, namespace, waiting), "Admitted")
    jobs.op.stays(lambda: jobs.pods(waiting) == [], 2.0, f"no pod of {waiting}")

    # The first finishes: its Workload is Finished, the quota goes to the third.
    done = admitted[0]
    cluster.set_pod_phase(namespace, jobs.wait_running(done), "Succeeded")
    jobs.wait_phase(done, "Succeeded")
    jobs.op.wait(lambda: _wl_true(_workload(cluster, namespace, done), "Finished"), 30, "Finished")
    jobs.wait_running(waiting, timeout=90)
    _on_pool(jobs, waiting, namespace)
    assert _wl_true(_workload(cluster, namespace, waiting), "Admitted")
    assert jobs.status(waiting)["restarts"] == 0


def test_a_higher_priority_job_preempts_a_lower_one_which_is_suspended_and_resumes(
    kueue: KueueProcess, queue: str, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    classes = {"low": 10, "high": 1000}
    for name, value in classes.items():
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{namespace}-{name}"[:63]},
                "value": value,
            }
        )
    try:
        jobs.apply(_job("low", 4, queue, f"{namespace}-low"[:63]))  # 8 GPUs: all of them
        jobs.wait_running("low", timeout=90)
        low_uid_pods = {p["metadata"]["uid"] for p in _live(jobs, "low")}
        workload = _workload(cluster, namespace, "low")
        assert workload["spec"]["priority"] == 10
        assert workload["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"

        jobs.apply(_job("high", 4, queue, f"{namespace}-high"[:63]))
        # Kueue evicts the lower Workload; its job stops, suspended, not failed.
        evicted = jobs.op.wait(
            lambda: next(
                (
                    e
                    for e in jobs.events("low")
                    if e["reason"] == "EvictedByKueue" and "Preempted" in e["message"]
                ),
                None,
            ),
            60,
            "low evicted (Preempted)",
        )
        assert evicted["type"] == "Normal", evicted
        jobs.wait_running("high", timeout=90)
        _on_pool(jobs, "high", namespace)
        low = jobs.wait_phase("low", "Suspended")
        assert low["reason"] == "QueuedByKueue", low
        assert (low["restarts"], low["uncountedRestarts"]) == (1, 1), low
        assert jobs.condition("low", "Failed") is None
        assert _live(jobs, "low") == [] and _live(jobs, "low", "launcher") == []
        low_wl = _workload(cluster, namespace, "low")
        assert not _wl_true(low_wl, "QuotaReserved") and "admission" not in low_wl["status"]
        assert _wl_true(low_wl, "Requeued"), low_wl["status"]

        # The higher job finishes; the lower one is admitted again and resumes as a
        # new attempt (new pods), its eviction never counted against backoffLimit.
        cluster.set_pod_phase(namespace, jobs.wait_running("high"), "Succeeded")
        jobs.wait_phase("high", "Succeeded")
        jobs.wait_running("low", timeout=90)
        resumed = _live(jobs, "low")
        assert {p["metadata"]["labels"]["horovod.ai/attempt"] for p in resumed} == {"1"}
        assert not low_uid_pods & {p["metadata"]["uid"] for p in resumed}
        _on_pool(jobs, "low", namespace)
        status = jobs.status("low")
        assert status["restarts"] - status["uncountedRestarts"] == 0
    finally:
        for name in classes:
            cluster.kubectl(
                "delete", "workloadpriorityclass", f"{namespace}-{name}"[:63], check=False
            )


def test_kueue_webhooks_are_called_and_the_operator_sees_the_workload_api(
    kueue: KueueProcess, cluster: KubeCluster
) -> None:
    assert kueue.webhook_called()
    configured = cluster.get(
        "validatingwebhookconfigurations", "kueue-validating-webhook-configuration"
    )
    urls = {hook["clientConfig"]["url"] for hook in configured["webhooks"]}
    assert (
        f"https://127.0.0.1:{kueue.webhook_port}/validate-kueue-x-k8s-io-v1beta2-workload" in urls
    )
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    try:
        assert asyncio.run(kube.serves("kueue.x-k8s.io/v1beta2", "workloads")) is True
    finally:
        kube.close()
