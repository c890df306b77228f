"""The tests' reads over HTTP print what `kubectl get -o json` prints (kube_reads.py)."""

from __future__ import annotations

import json
from typing import Any

from tests.support.cluster import KubeCluster
from tests.support.kube_reads import Reads


def _kubectl(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def _names(listed: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (item["apiVersion"], item["kind"], item["metadata"]["name"]) for item in listed["items"]
    ]


def test_reads_match_kubectl_and_leave_the_rest_to_it(cluster: KubeCluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "one", "-n", namespace, "--from-literal=a=1")
    cluster.kubectl("create", "configmap", "two", "-n", namespace, "--from-literal=a=2")
    cluster.kubectl("label", "configmap", "two", "-n", namespace, "pick=me")
    reads = Reads(cluster.kubeconfig)

    # A list: the same items, each with its apiVersion and kind, in a List.
    for kind in ("configmaps", "configmap", "cm"):
        read = reads.get(kind, namespace=namespace)
        assert read is not None and read[0] == 200
        assert read[1]["kind"] == "List"
        assert _names(read[1]) == _names(_kubectl(cluster, kind, "-n", namespace))
    picked = reads.get("cm", namespace=namespace, selector="pick=me")
    assert picked is not None and [n for _, _, n in _names(picked[1])] == ["two"]
    # One object; one that is not there; a cluster-scoped list; a CRD's short name.
    one = reads.get("configmap", "one", namespace)
    assert one is not None and one[1] == _kubectl(cluster, "configmap", "one", "-n", namespace)
    assert reads.get("configmap", "three", namespace) == (404, None)
    nodes = reads.get("nodes")
    assert nodes is not None and _names(nodes[1]) == _names(_kubectl(cluster, "nodes"))
    # `events` is core/v1's, as kubectl reads it, not events.k8s.io's.
    events = reads.get("events", namespace=namespace)
    assert events is not None and all(e["apiVersion"] == "v1" for e in events[1]["items"])
    # What it cannot be sure of, kubectl answers: kind/name, several kinds, an unknown kind.
    assert reads.get("configmap/one", namespace=namespace) is None
    assert reads.get("configmaps,secrets", namespace=namespace) is None
    assert reads.get("no-such-kind", namespace=namespace) is None
    # And the cluster's own helpers give the same answers either way.
    assert cluster.exists("configmap", "one", namespace)
    assert not cluster.exists("configmap", "three", namespace)
