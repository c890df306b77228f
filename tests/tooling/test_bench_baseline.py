"""bench.baseline creates exactly what the operator would for a job's first attempt."""

from __future__ import annotations

from collections import Counter

from bench import manifests
from bench.baseline import LauncherGate, children
from bench.report import ratios


def test_the_baseline_makes_the_operators_objects_for_the_job() -> None:
    body = manifests.horovod_job("j", 8, "Running")
    body["metadata"].update(namespace="ns", uid="u-1")
    objs = children(body)
    kinds = Counter(o["kind"] for o in objs)
    assert kinds == {"Secret": 1, "ConfigMap": 1, "Service": 1, "Pod": 8, "Job": 1}
    assert {o["metadata"]["namespace"] for o in objs} == {"ns"}
    pods = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "Pod")
    assert pods == [f"j-worker-{i}" for i in range(8)]
    # Owned by the job, as the operator's: deleting the job cleans them up.
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == "u-1" for o in objs)


def test_ours_is_compared_with_the_baseline_on_pods_only() -> None:
    stat = {"median": 2.0, "p95": 2.0, "n": 1}
    half = {"median": 1.0, "p95": 1.0, "n": 1}
    res = {"single": {"8": {"ours": {"pods": stat, "running": stat}, "baseline": {"pods": half}}}}
    assert ratios(res)["ours/baseline"] == {"1x8 pods": 2.0}


def _pod(job: str, index: int, ready: bool, role: str = "worker") -> dict[str, object]:
    return {
        "metadata": {
            "name": f"{job}-{role}-{index}",
            "labels": {"horovod.ai/job-name": job, "horovod.ai/role": role},
        },
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_the_ordered_baseline_creates_the_launcher_once_every_worker_is_ready() -> None:
    gate = LauncherGate()
    launcher = {"kind": "Job", "metadata": {"name": "j-launcher"}}
    assert gate.on_pod(_pod("j", 0, True)) is None  # Ready before the job is held
    assert gate.hold("j", 3, launcher) is None
    assert gate.on_pod(_pod("j", 1, True)) is None
    assert gate.on_pod(_pod("j", 1, False)) is None  # Ready no more: not counted
    assert gate.on_pod(_pod("j", 2, True)) is None
    assert gate.on_pod(_pod("j", 9, True, role="launcher")) is None
    assert gate.on_pod(_pod("other", 0, True)) is None
    assert gate.on_pod(_pod("j", 1, True)) is launcher
    assert gate.on_pod(_pod("j", 1, True)) is None  # released once


def test_a_deleted_worker_of_a_job_of_the_same_name_is_not_counted() -> None:
    gate = LauncherGate()
    gate.on_pod(_pod("j", 0, True))
    gate.on_pod(_pod("j", 0, True), deleted=True)  # the previous repeat's pod, going
    launcher = {"kind": "Job", "metadata": {"name": "j-launcher"}}
    assert gate.hold("j", 1, launcher) is None
    assert gate.hold("k", 0, launcher) is launcher  # no workers to wait for
