"""Where rank 0's output is read from (the line itself: test_training_log.py)."""

from __future__ import annotations

from typing import Any

from horovod_operator.first_step import rank0_sources


def _pod(name: str, containers: list[str], attempt: str = "0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"horovod.ai/attempt": attempt}},
        "spec": {"containers": [{"name": c} for c in containers]},
    }


def test_mpi_reads_the_launcher_pod_named_in_the_status() -> None:
    body = {
        "metadata": {"name": "j"},
        "spec": {},
        "status": {"launcher": {"podName": "j-launcher-abcde"}},
    }
    pods = [_pod("j-worker-0", ["worker"]), _pod("j-launcher-abcde", ["sidecar", "launcher"])]
    assert rank0_sources(body, pods) == [("j-launcher-abcde", "launcher")]
    # No launcher pod yet: nothing to read.
    assert rank0_sources({**body, "status": {}}, pods) == []


def test_gloo_reads_worker_0_of_the_current_attempt() -> None:
    body = {"metadata": {"name": "j"}, "spec": {"launchMode": "gloo"}, "status": {"restarts": 1}}
    assert rank0_sources(body, [_pod("j-worker-0", ["worker"], attempt="0")]) == []
    assert rank0_sources(body, [_pod("j-worker-0", ["trainer"], attempt="1")]) == [
        ("j-worker-0", "trainer"),
    ]


def _elastic_pod(name: str, phase: str, index: int, attempt: str = "0") -> dict[str, Any]:
    labels = {"horovod.ai/attempt": attempt, "horovod.ai/role": "worker",
              "horovod.ai/worker-index": str(index)}  # fmt: skip
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "worker"}]},
        "status": {"phase": phase},
    }


def test_an_elastic_jobs_rank_0_is_looked_for_in_its_running_workers_by_index() -> None:
    body = {
        "metadata": {"name": "j"},
        "spec": {"launchMode": "gloo", "elastic": {"minReplicas": 1, "maxReplicas": 8}},
        "status": {"restarts": 1},
    }
    pods = [
        _elastic_pod("j-worker-10", "Running", 10, attempt="1"),
        _elastic_pod("j-worker-2", "Running", 2, attempt="1"),
        _elastic_pod("j-worker-0", "Pending", 0, attempt="1"),  # waits: no log yet
        _elastic_pod("j-worker-1", "Running", 1, attempt="0"),  # the last attempt's
        *(_elastic_pod(f"j-worker-{i}", "Running", i, attempt="1") for i in (4, 5)),
        # Stopped by the clean-up policy at the end (SIGTERM: Failed): its log remains.
        _elastic_pod("j-worker-3", "Failed", 3, attempt="1"),
    ]
    # Rank 0 starts on the first worker the launcher found Ready, whichever that was:
    # the lowest indexes first, at most a few per look.
    assert [pod for pod, _ in rank0_sources(body, pods)] == [
        "j-worker-2", "j-worker-3", "j-worker-4", "j-worker-5",
    ]  # fmt: skip


def test_a_hand_made_index_label_neither_stops_the_scan_nor_comes_first() -> None:
    """A pod labelled by hand with a worker index that is no number (or two pods with
    one index) once raised inside the scan, which stopped it for every job."""
    body = {
        "metadata": {"name": "j"},
        "spec": {"launchMode": "gloo", "elastic": {"minReplicas": 1, "maxReplicas": 8}},
        "status": {"restarts": 0},
    }
    odd = _elastic_pod("j-worker-x", "Running", 0)
    odd["metadata"]["labels"]["horovod.ai/worker-index"] = "first"
    twin = _elastic_pod("j-worker-1b", "Running", 1)
    pods = [odd, twin, _elastic_pod("j-worker-1", "Running", 1)]
    assert [pod for pod, _ in rank0_sources(body, pods)] == [
        "j-worker-1", "j-worker-1b", "j-worker-x",
    ]  # fmt: skip
