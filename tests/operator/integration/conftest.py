"""Fixtures the operator's integration tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.cluster import KubeCluster

POOL_LABEL = "horovod.ai/test-pool"


@contextmanager
def node_pool(
    cluster: KubeCluster,
    namespace: str,
    count: int = 2,
    labels: Callable[[int], dict[str, str]] = lambda _: {},
) -> Iterator[dict[str, Any]]:
    """`count` kwok nodes of 8 GPUs (with `labels(i)` each) that only this test's pods
    tolerate; their names and the worker template that lands there."""
    nodes = cluster.add_kwok_nodes(count, 8, prefix=f"{namespace[:40]}-")
    try:
        for i, node in enumerate(nodes):
            more = [f"{k}={v}" for k, v in labels(i).items()]
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}={namespace}", *more)
            cluster.kubectl("taint", "node", node, f"{POOL_LABEL}={namespace}:NoSchedule")
        cluster.wait_nodes_ready()
        template = {
            "spec": {
                "nodeSelector": {POOL_LABEL: namespace},
                "tolerations": [{"key": POOL_LABEL, "operator": "Exists"}],
            }
        }
        yield {"nodes": nodes, "template": template}
    finally:
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)


@pytest.fixture
def pool(cluster: KubeCluster, namespace: str) -> Iterator[dict[str, Any]]:
    """Two kwok nodes of 8 GPUs that only this test's pods tolerate."""
    with node_pool(cluster, namespace) as found:
        yield found
