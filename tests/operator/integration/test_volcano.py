"""gang.policy Volcano against Volcano's real scheduler (vc-scheduler v1.14.1,
built from the module) with kwok GPU nodes: a gang that cannot fit binds no pod,
and two jobs that fit only one at a time run one after the other, whole, in the
Volcano Queue the job names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import gangs
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

VOLCANO_GROUPS = "podgroups.scheduling.volcano.sh"


@pytest.fixture(scope="module")
def volcano(cluster: KubeCluster) -> Iterator[gangs.VolcanoScheduler]:
    """Volcano's CRDs, default Queue and scheduler, once for this module (before
    the operator of each test starts, so that it detects the PodGroup API); the
    CRDs go after, so later tests see a cluster without Volcano."""
    scheduler = gangs.VolcanoScheduler(
        cluster.kubeconfig,
        cluster.kubectl,
        cluster.layout.root / "volcano",
        cluster.logs_dir / "volcano-scheduler.log",
    )
    try:
        seconds = scheduler.start()
        print(f"vc-scheduler (pid {scheduler.pid}) healthy in {seconds:.1f}s")
        yield scheduler
    finally:
        print(f"--- vc-scheduler log ---\n{scheduler.tail(30)}")
        scheduler.stop()
        scheduler.uninstall()


@pytest.fixture
def queue(volcano: gangs.VolcanoScheduler, cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """A Volcano Queue of the test's own."""
    name = namespace[:63]
    gangs.volcano_queue(cluster.kubectl, name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "queue.scheduling.volcano.sh", name, "--wait=false", check=False)


def _job(name: str, queue: str, template: dict[str, Any]) -> dict[str, Any]:
    manifest = hvjob(name, replicas=2)
    manifest["spec"]["worker"]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    manifest["spec"]["worker"]["template"] = template
    manifest["spec"]["scheduling"] = {"gang": {"policy": "Volcano"}, "queue": queue}
    return manifest


def test_two_volcano_gangs_that_fit_only_one_at_a_time_run_one_after_the_other_whole(
    volcano: gangs.VolcanoScheduler,
    queue: str,
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
) -> None:
    nodes = pool["nodes"]
    # One pool node first: the first gang cannot fit, and a scheduler without the
    # gang would bind one of its workers there.
    cluster.kubectl("cordon", nodes[1])
    jobs.apply(_job("first", queue, pool["template"]))

    def bound(name: str) -> list[str]:
        return [p["metadata"]["name"] for p in jobs.pods(name) if p["spec"].get("nodeName")]

    stalled = jobs.op.wait(lambda: jobs.condition("first", "Stalled"), 60, "first Stalled")
    print(f"first, with one node of two: {stalled['reason']}: {stalled['message']}")
    jobs.op.stays(lambda: bound("first") == [], 5.0, "no pod of an incomplete gang bound")

    jobs.apply(_job("second", queue, pool["template"]))
    jobs.op.wait(lambda: len(jobs.pods("second")) == 2, 30, "the second job's workers")
    cluster.kubectl("uncordon", nodes[1])
    names = ("first", "second")
    winner = jobs.op.wait(
        lambda: next((n for n in names if len(bound(n)) == 2), None), 90, "one whole gang bound"
    )
    waiting = next(n for n in names if n != winner)
    jobs.op.stays(lambda: bound(waiting) == [], 5.0, f"no pod of {waiting} bound")
    group = cluster.get(VOLCANO_GROUPS, f"{waiting}-gang-0-2", namespace)
    assert group["spec"]["queue"] == queue
    assert group["spec"]["minResources"] == {"nvidia.com/gpu": "16"}
    assert group["status"]["phase"] in ("Pending", "Inqueue"), group["status"]
    assert cluster.get(VOLCANO_GROUPS, f"{winner}-gang-0-2", namespace)["status"]["phase"] in (
        "Running",
        "Inqueue",
    )
    for pod in jobs.pods(waiting):
        assert (
            pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
            == group["metadata"]["name"]
        )
        assert pod["spec"]["schedulerName"] == "volcano"
    stalled = jobs.op.wait(lambda: jobs.condition(waiting, "Stalled"), 60, "the other Stalled")
    print(f"{waiting} while it waits: {stalled['reason']}: {stalled['message']}")
    assert stalled["reason"] == "Unschedulable", stalled

    # The first finishes; its workers go (cleanPodPolicy Running) and the second
    # is placed, whole, on the freed GPUs.
    launcher = jobs.wait_running(winner)
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase(winner, "Succeeded")
    jobs.wait_running(waiting, timeout=120)
    assert len(bound(waiting)) == 2
