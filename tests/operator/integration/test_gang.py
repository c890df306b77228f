"""Native gang scheduling against the real kube-scheduler (Workload API, KEP-4671):
two jobs that each fit but not together run one after the other, whole."""

from __future__ import annotations

import asyncio
from typing import Any

from horovod_operator.kube import Kube
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob


def _gang_job(name: str, template: dict[str, Any]) -> dict[str, Any]:
    manifest = hvjob(name, replicas=2)
    manifest["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    manifest["spec"]["worker"]["template"] = template
    return manifest


def test_two_gangs_that_fit_only_one_at_a_time_run_one_after_the_other_whole(
    jobs: Jobs, cluster: KubeCluster, namespace: str, pool: dict[str, Any]
) -> None:
    names = ("first", "second")
    for name in names:
        jobs.apply(_gang_job(name, pool["template"]))

    def bound(name: str) -> list[str]:
        return [p["metadata"]["name"] for p in jobs.pods(name) if p["spec"].get("nodeName")]

    winner = jobs.op.wait(
        lambda: next((n for n in names if len(bound(n)) == 2), None), 60, "one whole gang bound"
    )
    waiting = next(n for n in names if n != winner)
    # The other gang waits whole: not one of its pods holds a GPU it cannot use.
    stalled = jobs.op.wait(lambda: jobs.condition(waiting, "Stalled"), 30, "the other Stalled")
    assert stalled["reason"] == "Unschedulable", stalled
    assert "Insufficient nvidia.com/gpu" in stalled["message"], stalled
    jobs.op.stays(lambda: bound(waiting) == [], 2.0, f"no pod of {waiting} bound")
    group = cluster.get("podgroup", f"{waiting}-gang-0-2", namespace)
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == jobs.uid(waiting)
    for pod in jobs.pods(waiting):
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"{waiting}-gang-0-2"}

    # The first finishes; its workers go (cleanPodPolicy Running) and the second
    # is placed, whole, on the freed GPUs.
    launcher = jobs.wait_running(winner)
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase(winner, "Succeeded")
    jobs.wait_running(waiting, timeout=90)
    assert len(bound(waiting)) == 2


def test_the_operator_detects_whether_the_server_serves_pod_groups(cluster: KubeCluster) -> None:
    async def served(group_version: str, plural: str) -> bool:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        try:
            return await kube.serves(group_version, plural)
        finally:
            await kube.close()

    assert asyncio.run(served("scheduling.k8s.io/v1beta1", "podgroups")) is True
    assert asyncio.run(served("scheduling.k8s.io/v1beta1", "nothings")) is False
    # A group version the server does not know answers 404: not served.
    assert asyncio.run(served("scheduling.k8s.io/v9", "podgroups")) is False
    # A group nobody serves (Kueue's, before it is installed) answers a plain-text 404.
    assert asyncio.run(served("kueue.x-k8s.io/v1beta2", "workloads")) is False
