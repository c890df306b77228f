"""Volcano's and scheduler-plugins' coscheduling PodGroups against the real API
server with their CRDs (as the modules ship them), and coscheduling against its
real scheduler (scheduler-plugins' kube-scheduler, built from the module) with
kwok GPU nodes: two jobs that fit only one at a time run one after the other,
whole. Volcano's scheduler is not built here (docs/scheduling.md#volcano)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import gangs
from tests.support.cluster import KubeCluster
from tests.support.operator import Jobs, hvjob

VOLCANO_GROUPS = "podgroups.scheduling.volcano.sh"
COSCHEDULING_GROUPS = "podgroups.scheduling.x-k8s.io"


@pytest.fixture
def volcano_crd(cluster: KubeCluster) -> Iterator[Path]:
    """Volcano's PodGroup CRD, installed before the test's operator starts (it
    detects the API at start), deleted after, so later tests see a cluster without."""
    path = gangs.volcano_crd()
    gangs.install_crd(cluster.kubectl, path)
    try:
        yield path
    finally:
        gangs.uninstall_crd(cluster.kubectl, path)


@pytest.fixture(scope="module")
def coscheduling(cluster: KubeCluster) -> Iterator[gangs.CoschedulingScheduler]:
    """scheduler-plugins' PodGroup CRD and its scheduler with Coscheduling, once
    for this module."""
    path = gangs.coscheduling_crd()
    gangs.install_crd(cluster.kubectl, path)
    scheduler = gangs.CoschedulingScheduler(
        cluster.kubeconfig,
        cluster.layout.root / "coscheduling",
        cluster.logs_dir / "coscheduling-scheduler.log",
    )
    try:
        seconds = scheduler.start()
        print(f"coscheduling scheduler (pid {scheduler.pid}) healthy in {seconds:.1f}s")
        yield scheduler
    finally:
        print(f"--- coscheduling scheduler log ---\n{scheduler.tail(40)}")
        scheduler.stop()
        gangs.uninstall_crd(cluster.kubectl, path)


def _job(
    name: str, policy: str, template: dict[str, Any] | None = None, **scheduling: Any
) -> dict[str, Any]:
    manifest = hvjob(name, replicas=2)
    manifest["spec"]["worker"]["resources"] = {
        "limits": {"nvidia.com/gpu": 8},
        "requests": {"cpu": "500m"},
    }
    if template is not None:
        manifest["spec"]["worker"]["template"] = template
    manifest["spec"]["scheduling"] = {"gang": {"policy": policy}, **scheduling}
    return manifest


def test_a_volcano_job_gets_its_group_first_its_pods_join_it_and_it_goes_with_the_job(
    volcano_crd: Path, jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    high = f"{namespace}-high"
    cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": high}, "value": 1000})  # fmt: skip
    try:
        _volcano_job(jobs, cluster, namespace, high)
    finally:
        cluster.kubectl("delete", "priorityclass", high, "--ignore-not-found", check=False)


def _volcano_job(jobs: Jobs, cluster: KubeCluster, namespace: str, priority: str) -> None:
    jobs.apply(_job("vc", "Volcano", queue="research", priorityClassName=priority))

    def two_workers() -> list[dict[str, Any]] | None:
        pods = jobs.pods("vc")
        return pods if len(pods) == 2 else None

    pods = jobs.op.wait(two_workers, 30, "2 workers")
    group = cluster.get(VOLCANO_GROUPS, "vc-gang-0-2", namespace)
    # Created before its pods: the scheduler never sees a member without its group.
    first_pod = min(p["metadata"]["creationTimestamp"] for p in pods)
    assert group["metadata"]["creationTimestamp"] <= first_pod
    assert group["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "1", "nvidia.com/gpu": "16"},
        "queue": "research",
        "priorityClassName": priority,
    }
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "HorovodJob",
        jobs.uid("vc"),
        True,
    )
    for pod in pods:
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "vc-gang-0-2"
        assert pod["spec"]["schedulerName"] == "volcano"
        assert not pod["spec"].get("nodeName")  # no Volcano scheduler here: nobody binds them
    # Deleting the job deletes its group (garbage collection of the owned object;
    # the collector starts watching a kind its discovery resync, every 30s, finds).
    cluster.kubectl("delete", "hvjob", "vc", "-n", namespace)
    started = time.monotonic()
    jobs.op.wait(
        lambda: not cluster.exists(VOLCANO_GROUPS, "vc-gang-0-2", namespace), 90, "group deleted"
    )
    print(f"the job's PodGroup deleted {time.monotonic() - started:.1f}s after the job")


def test_without_the_volcano_crd_the_job_waits_saying_what_to_install(
    jobs: Jobs, cluster: KubeCluster, namespace: str
) -> None:
    assert not cluster.exists("crd", VOLCANO_GROUPS)
    jobs.apply(_job("novc", "Volcano"))
    stalled = jobs.op.wait(lambda: jobs.condition("novc", "Stalled"), 30, "Stalled")
    assert stalled["reason"] == "GangSchedulingUnavailable", stalled
    assert "scheduling.volcano.sh/v1beta1" in stalled["message"]
    assert "install Volcano" in stalled["message"]
    jobs.op.stays(lambda: jobs.pods("novc") == [], 2.0, "no worker without its gang")
    assert jobs.status("novc")["phase"] == "Pending"


def test_two_coscheduled_gangs_that_fit_only_one_at_a_time_run_one_after_the_other_whole(
    coscheduling: gangs.CoschedulingScheduler,
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
) -> None:
    nodes = pool["nodes"]
    # One pool node first: the first job's gang cannot fit, and a scheduler without
    # the gang would bind one of its workers there (then, with the second job and
    # node, each job would hold one node and wait on the other forever).
    cluster.kubectl("cordon", nodes[1])
    jobs.apply(_job("first", "Coscheduling", template=pool["template"]))

    def bound(name: str) -> list[str]:
        return [p["metadata"]["name"] for p in jobs.pods(name) if p["spec"].get("nodeName")]

    stalled = jobs.op.wait(lambda: jobs.condition("first", "Stalled"), 60, "first Stalled")
    print(f"first, with one node of two: {stalled['reason']}: {stalled['message']}")
    jobs.op.stays(lambda: bound("first") == [], 5.0, "no pod of an incomplete gang bound")

    jobs.apply(_job("second", "Coscheduling", template=pool["template"]))
    jobs.op.wait(lambda: len(jobs.pods("second")) == 2, 30, "the second job's workers")
    cluster.kubectl("uncordon", nodes[1])
    names = ("first", "second")
    winner = jobs.op.wait(
        lambda: next((n for n in names if len(bound(n)) == 2), None), 90, "one whole gang bound"
    )
    waiting = next(n for n in names if n != winner)
    # The other gang waits whole: not one of its pods holds a GPU it cannot use.
    jobs.op.stays(lambda: bound(waiting) == [], 5.0, f"no pod of {waiting} bound")
    group = cluster.get(COSCHEDULING_GROUPS, f"{waiting}-gang-0-2", namespace)
    assert group["spec"]["minMember"] == 2
    assert group["spec"]["minResources"] == {"cpu": "1", "nvidia.com/gpu": "16"}
    assert group["spec"]["scheduleTimeoutSeconds"] == 1200  # runPolicy's default
    assert group["metadata"]["ownerReferences"][0]["uid"] == jobs.uid(waiting)
    for pod in jobs.pods(waiting):
        labels = pod["metadata"]["labels"]
        assert labels["scheduling.x-k8s.io/pod-group"] == f"{waiting}-gang-0-2"
        assert pod["spec"]["schedulerName"] == gangs.SCHEDULER_NAME
    stalled = jobs.op.wait(lambda: jobs.condition(waiting, "Stalled"), 60, "the other Stalled")
    assert stalled["reason"] == "Unschedulable", stalled
    assert "Insufficient nvidia.com/gpu" in stalled["message"], stalled
    print(f"{waiting} while it waits: {stalled['reason']}: {stalled['message']}")

    # The first finishes; its workers go (cleanPodPolicy Running) and the second
    # is placed, whole, on the freed GPUs.
    launcher = jobs.wait_running(winner)
    cluster.set_pod_phase(namespace, launcher, "Succeeded")
    jobs.wait_phase(winner, "Succeeded")
    jobs.wait_running(waiting, timeout=120)
    assert len(bound(waiting)) == 2


def test_a_coscheduled_job_of_the_longest_name_restarts_ten_times_with_one_group_at_a_time(
    coscheduling: gangs.CoschedulingScheduler,
    jobs: Jobs,
    cluster: KubeCluster,
    namespace: str,
    pool: dict[str, Any],
) -> None:
    """Each restart's gang gets a new group; its label fits (63 characters) at every
    attempt, and the earlier groups go, so the job never collects one per attempt."""
    name = ("long-" * 11)[:53] + "x"
    assert len(name) == 54
    manifest = _job(name, "Coscheduling", template=pool["template"])
    manifest["spec"]["runPolicy"]["backoffLimit"] = 20
    jobs.apply(manifest)
    restarts = 11

    def running(attempt: int) -> str | None:
        status = jobs.status(name)
        if status.get("phase") != "Running" or status.get("restarts") != attempt:
            return None
        return jobs.launcher_pod(name)

    def live_groups() -> list[str]:
        """The job's coscheduling groups not being deleted."""
        return [
            g["metadata"]["name"]
            for g in cluster.get(COSCHEDULING_GROUPS, None, namespace)["items"]
            if g["metadata"]["name"].startswith(name[:20])
            and not g["metadata"].get("deletionTimestamp")
        ]

    for attempt in range(restarts + 1):
        launcher = jobs.op.wait(functools.partial(running, attempt), 60, f"attempt {attempt}")
        labels = {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in jobs.pods(name)}
        # The earlier group's deletion is one request after the new group's create.
        jobs.op.wait(lambda: len(live_groups()) == 1, 20, f"one PodGroup at attempt {attempt}")
        (group,) = live_groups()
        print(f"attempt {attempt}: group {group}, pods' group {labels}")
        assert len(group) <= 63 and labels == {group}, (group, labels)
        assert group.endswith(f"-gang-{attempt}-2"), group
        if attempt < restarts:
            cluster.set_pod_phase(namespace, launcher, "Failed", exit_code=1)
    status = jobs.status(name)
    assert status["phase"] == "Running" and status["restarts"] == restarts, status
    assert jobs.condition(name, "Failed") is None
