"""Kueue for the integration tests: the real process, a GPU queue on kwok nodes of
the test's own, and the reads the tests make of a job's Workload."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from localcluster.kueue import KueueProcess
from tests.support.cluster import KubeCluster
from tests.support.operator import hvjob

POOL_LABEL = "horovod.ai/test-pool"
WORKLOADS = "workloads.kueue.x-k8s.io"


@contextmanager
def kueue_process(
    cluster: KubeCluster,
    name: str = "kueue",
    wait_for_pods_ready: dict[str, Any] | None = None,
    multi_kueue: dict[str, Any] | None = None,
) -> Iterator[KueueProcess]:
    """Kueue with its CRDs and webhooks (started before the operator of each test, so
    that it detects the Workload API). Its webhooks go before it stops, and its CRDs
    after, so later tests see a cluster without it."""
    process = KueueProcess(
        cluster.kubeconfig,
        cluster.kubectl,
        cluster.layout.pki,
        cluster.layout.root / name,
        cluster.logs_dir / f"{name}.log",
        wait_for_pods_ready=wait_for_pods_ready,
        multi_kueue=multi_kueue,
    )
    try:
        seconds = process.start()
        print(f"Kueue (pid {process.pid}) ready with its webhooks in {seconds:.1f}s")
        yield process
    finally:
        print(f"--- Kueue log ---\n{process.tail(40)}")
        process.stop()
        process.uninstall_crds()


def pool_nodes(namespace: str) -> list[str]:
    """The two kwok nodes of the test's flavor (gpu_queue)."""
    return [f"{namespace[:40]}-{i}" for i in range(2)]


def _taint_pool(
    cluster: KubeCluster, namespace: str, labels: dict[str, dict[str, str]]
) -> dict[str, str]:
    """Label and taint the test's nodes (each with its own `labels` too) as its flavor's
    pool, so that only pods of that flavor land there; the flavor's toleration."""
    for node, own in labels.items():
        pairs = [f"{key}={value}" for key, value in {POOL_LABEL: namespace, **own}.items()]
        cluster.kubectl("label", "node", node, *pairs)
        cluster.kubectl("taint", "node", node, f"{POOL_LABEL}={namespace}:NoSchedule")
    cluster.wait_nodes_ready()
    return {"key": POOL_LABEL, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}


@contextmanager
def gpu_queue(
    cluster: KubeCluster,
    namespace: str,
    gpus: int = 8,
    admission_checks: Sequence[str] = (),
    resource: str = "nvidia.com/gpu",
) -> Iterator[str]:
    """A LocalQueue `gpus` in the test's namespace, of a ClusterQueue with `gpus` GPUs
    of one ResourceFlavor whose nodes are two tainted kwok nodes of 8 GPUs that only
    this test's flavor leads to (16 GPUs there: the quota, not the nodes, limits);
    every Workload of it waits for `admission_checks`."""
    nodes = cluster.add_kwok_nodes(2, 8, prefix=f"{namespace[:40]}-")
    assert nodes == pool_nodes(namespace)
    flavor = cluster_queue = namespace
    try:
        toleration = _taint_pool(cluster, namespace, {node: {} for node in nodes})
        quota = {"name": resource, "nominalQuota": gpus}
        for obj in (
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {POOL_LABEL: namespace}, "tolerations": [toleration]},
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
                    **(
                        {
                            "admissionChecksStrategy": {
                                "admissionChecks": [{"name": n} for n in admission_checks]
                            }
                        }
                        if admission_checks
                        else {}
                    ),
                    "resourceGroups": [
                        {
                            "coveredResources": [resource],
                            "flavors": [{"name": flavor, "resources": [quota]}],
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


RACK_LABEL = "horovod.ai/test-rack"


@contextmanager
def rack_queue(cluster: KubeCluster, namespace: str) -> Iterator[dict[str, list[str]]]:
    """A LocalQueue `gpus` of a ClusterQueue with 32 GPUs of one Topology Aware
    Scheduling flavor: two racks of two tainted kwok nodes of 8 GPUs each, and a Topology
    of rack and hostname (Kueue v0.17's TopologyAwareScheduling, Beta and on). Yields
    the nodes by rack."""
    racks = {
        f"{namespace[:36]}-{rack}": cluster.add_kwok_nodes(2, 8, prefix=f"{namespace[:36]}-{rack}-")
        for rack in ("a", "b")
    }
    nodes = [node for members in racks.values() for node in members]
    name = namespace
    try:
        in_rack = {node: {RACK_LABEL: rack} for rack, members in racks.items() for node in members}
        toleration = _taint_pool(cluster, namespace, in_rack)
        for obj in (
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Topology",
                "metadata": {"name": name},
                "spec": {
                    "levels": [{"nodeLabel": RACK_LABEL}, {"nodeLabel": "kubernetes.io/hostname"}]
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": name},
                "spec": {
                    "nodeLabels": {POOL_LABEL: namespace},
                    "tolerations": [toleration],
                    "topologyName": name,
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": name,
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 32}],
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
                "spec": {"clusterQueue": name},
            },
        ):
            cluster.apply(obj)
        yield racks
    finally:
        cluster.kubectl(
            "delete", "localqueue", "gpus", "-n", namespace, "--wait=false", check=False
        )
        for kind in ("clusterqueue", "resourceflavor", "topologies.kueue.x-k8s.io"):
            cluster.kubectl("delete", kind, name, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def queued_job(name: str, gpus: int, queue: str, priority: str | None = None) -> dict[str, Any]:
    """Two workers of `gpus` GPUs each, in `queue`."""
    scheduling: dict[str, Any] = {"queue": queue}
    if priority:
        scheduling["priorityClassName"] = priority
    manifest = hvjob(name, replicas=2, scheduling=scheduling)
    manifest["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return manifest


def find_workload(cluster: KubeCluster, namespace: str, job: str) -> dict[str, Any] | None:
    """The job's Workload, read through the API (what `kubectl get workloads` lists),
    or None before the operator has created it (a poll must not fail on that)."""
    items = cluster.get(WORKLOADS, namespace=namespace, selector=f"horovod.ai/job-name={job}")
    assert len(items["items"]) <= 1, items
    found: dict[str, Any] | None = items["items"][0] if items["items"] else None
    return found


def workload_of(cluster: KubeCluster, namespace: str, job: str) -> dict[str, Any]:
    """The job's Workload, which must exist by now."""
    found = find_workload(cluster, namespace, job)
    assert found is not None, f"no Workload of {job} in {namespace}"
    return found


def workload_condition(workload: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for condition in workload.get("status", {}).get("conditions", []):
        if condition["type"] == type_:
            found: dict[str, Any] = condition
            return found
    return None


def workload_true(workload: dict[str, Any], type_: str) -> bool:
    condition = workload_condition(workload, type_)
    return condition is not None and condition["status"] == "True"
