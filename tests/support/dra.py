"""DRA devices for tests: a DeviceClass and ResourceSlices the real kube-scheduler
allocates from (no driver is needed to allocate; kwok plays the kubelet)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tests.support.cluster import KubeCluster

GPU_CLASS = "gpu.nvidia.com"  # also the driver: a class the operator counts by default
DEVICES_PER_NODE = 4


def apply(cluster: KubeCluster, *docs: dict[str, Any], namespace: str | None = None) -> None:
    where = ["-n", namespace] if namespace else []
    body = "\n---\n".join(json.dumps(d) for d in docs)
    cluster.kubectl("apply", *where, "-f", "-", input=body)


def device_class(name: str) -> dict[str, Any]:
    """A DeviceClass of every device its driver (of the same name) publishes."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]},
    }


def claim_template(name: str, count: int, device_class: str = GPU_CLASS) -> dict[str, Any]:
    """A ResourceClaimTemplate of `count` devices of one class."""
    request = {"deviceClassName": device_class, "count": count}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "devices", "exactly": request}]}}},
    }


@contextmanager
def gpu_slices(cluster: KubeCluster, nodes: Sequence[str]) -> Iterator[list[str]]:
    """The GPU DeviceClass, and a ResourceSlice of DEVICES_PER_NODE GPUs for each node
    (owned by the node, as a DRA driver's kubelet plugin publishes them)."""
    apply(cluster, device_class(GPU_CLASS))
    slices = []
    for node in nodes:
        uid = cluster.get("node", node)["metadata"]["uid"]
        slices.append(f"{node}-gpus")
        apply(
            cluster,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": f"{node}-gpus",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
                    ],
                },
                "spec": {
                    "driver": GPU_CLASS,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}}
                        for i in range(DEVICES_PER_NODE)
                    ],
                },
            },
        )
    try:
        yield slices
    finally:
        cluster.kubectl("delete", "resourceslice", *slices, "--wait=false", check=False)


def with_claim(manifest: dict[str, Any], template: str, pool_template: dict[str, Any]) -> Any:
    """The job's workers on the pool, each with a claim made from `template` and no
    device-plugin GPU."""
    worker = manifest["spec"]["worker"]
    worker.pop("resources", None)
    spec = json.loads(json.dumps(pool_template))["spec"]
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    spec["containers"] = [{"name": "worker", "resources": {"claims": [{"name": "gpus"}]}}]
    worker["template"] = {"spec": spec}
    return manifest
