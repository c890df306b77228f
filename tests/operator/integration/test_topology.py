"""spec.scheduling.topology against the real kube-scheduler: kwok nodes labelled by
rack, the native gang's PodGroup topology constraint (Kubernetes 1.37,
TopologyAwareWorkloadScheduling) and the preferred pod affinity."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.operator.integration.conftest import node_pool
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

RACK = "topology.kubernetes.io/rack"


@pytest.fixture
def racks(cluster: KubeCluster, namespace: str) -> Iterator[dict[str, Any]]:
    """Two racks of two kwok nodes of 8 GPUs, that only this test's pods tolerate."""

    def rack(i: int) -> dict[str, str]:
        return {RACK: f"rack-{'ab'[i // 2]}"}

    with node_pool(cluster, namespace, 4, rack) as pool:
        rack_of = {node: rack(i)[RACK] for i, node in enumerate(pool["nodes"])}
        yield {"rack_of": rack_of, "template": pool["template"]}


def _job(name: str, replicas: int, mode: str, template: dict[str, Any]) -> dict[str, Any]:
    manifest = hvjob(name, replicas=replicas, scheduling={"topology": {"key": RACK, "mode": mode}})
    manifest["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    manifest["spec"]["worker"]["template"] = template
    return manifest


def test_workers_stay_in_one_rack_or_wait_and_preferred_spreads_only_when_it_must(
    jobs: Jobs, cluster: KubeCluster, namespace: str, racks: dict[str, Any]
) -> None:
    def racks_of(name: str) -> list[str]:
        return sorted(racks["rack_of"][p["spec"]["nodeName"]] for p in jobs.pods(name))

    # Two workers of a full node each: one rack holds them, and they land in one.
    jobs.apply(_job("fits", 2, "Required", racks["template"]))
    jobs.wait_running("fits", timeout=60)
    assert len(set(racks_of("fits"))) == 1, racks_of("fits")
    group = cluster.get("podgroup", "fits-gang-0-2", namespace)
    assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": RACK}]}
    cluster.kubectl("delete", "hvjob", "fits", "-n", namespace, "--wait=true")
    jobs.op.wait(lambda: jobs.pods("fits") == [], 60, "fits' pods gone")

    # Three: the cluster has room (four free nodes), but no rack does. It waits
    # whole, saying what the scheduler says.
    jobs.apply(_job("wide", 3, "Required", racks["template"]))
    stalled = jobs.op.wait(lambda: jobs.condition("wide", "Stalled"), 60, "wide Stalled")
    print(f"wide: {stalled['reason']}: {stalled['message']}")
    assert stalled["reason"] == "Unschedulable", stalled
    assert f"every worker in one {RACK} domain" in stalled["message"], stalled
    jobs.op.stays(
        lambda: not [p for p in jobs.pods("wide") if p["spec"].get("nodeName")],
        3.0,
        "no worker of wide bound",
    )
    cluster.kubectl("delete", "hvjob", "wide", "-n", namespace, "--wait=true")
    jobs.op.wait(lambda: jobs.pods("wide") == [], 60, "wide's pods gone")

    # Preferred: as few racks as fit, here two (two workers in one, one in the other).
    jobs.apply(_job("spread", 3, "Preferred", racks["template"]))
    jobs.wait_running("spread", timeout=60)
    placed = racks_of("spread")
    assert sorted(placed.count(r) for r in set(placed)) == [1, 2], placed
