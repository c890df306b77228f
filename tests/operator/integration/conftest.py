"""Fixtures the operator's integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import KubeCluster

POOL_LABEL = "horovod.ai/test-pool"


@pytest.fixture
def pool(cluster: KubeCluster, namespace: str) -> Iterator[dict[str, Any]]:
    """Two kwok nodes of 8 GPUs that only this test's pods tolerate; their names
    and the worker template that lands there."""
    nodes = cluster.add_kwok_nodes(2, 8, prefix=f"{namespace[:40]}-")
    try:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}={namespace}")
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
