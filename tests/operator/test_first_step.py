"""Where rank 0's first-step line is read from, and how it is found."""

from __future__ import annotations

import asyncio
from typing import Any

from horovod_operator.first_step import FirstStepWatcher, find_first_step, rank0_sources
from horovod_operator.memory import Indexes

STAMPED = (
    "2026-12-01T11:03:27.123456789Z Warning: Permanently added host\n"
    "2026-12-01T11:03:31.5Z [1,1]<stdout>:HVJOB_RANK rank=1 size=2 local_rank=0\n"
    "2026-12-01T11:03:31.987654321Z [1,0]<stdout>:HVJOB_RANK rank=0 size=2 local_rank=0\n"
)


def test_rank_0s_line_is_found_with_the_kubelets_timestamp() -> None:
    assert find_first_step(STAMPED) == (True, "2026-12-01T11:03:31Z")


def test_without_timestamps_the_line_is_still_found() -> None:
    assert find_first_step("HVJOB_RANK rank=0 size=1 local_rank=0\n") == (True, None)


def test_other_ranks_and_look_alikes_are_not_rank_0() -> None:
    assert find_first_step("HVJOB_RANK rank=1 size=2\nHVJOB_RANK rank=10 size=12\n") == (
        False,
        None,
    )
    assert find_first_step("") == (False, None)


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
        *(_elastic_pod(f"j-worker-{i}", "Running", i, attempt="1") for i in (3, 4, 5)),
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


class _Kube:
    """The three calls the watcher makes, recorded; logs served from a dict."""

    def __init__(self, logs: dict[str, str]) -> None:
        self.logs = logs
        self.reads: list[str] = []
        self.patches: list[dict[str, Any]] = []
        self.events: list[str] = []

    async def pod_log(self, namespace: str, pod: str, container: str | None, limit: int) -> str:
        self.reads.append(pod)
        return self.logs.get(pod, "")

    async def patch_job_status(
        self, namespace: str, name: str, rv: str | None, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.patches.append(status)
        return {}

    async def post_event(self, job: Any, type_: str, reason: str, message: str, t: str) -> None:
        self.events.append(reason)


def _job(phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "uid": "u1", "creationTimestamp": "2026-12-01T11:03:00Z"},
        "spec": {},
        "status": {"phase": phase, "launcher": {"podName": "j-launcher-abcde"}},
    }


def _watcher(kube: _Kube, indexes: Indexes) -> FirstStepWatcher:
    return FirstStepWatcher(kube, lambda: indexes, lambda: True)  # type: ignore[arg-type]


def test_a_job_that_finishes_between_two_looks_gets_a_last_look() -> None:
    kube = _Kube({"j-launcher-abcde": "2026-12-01T11:03:27Z importing\n"})
    key = ("ns", "j")
    jobs = {key: [_job("Running")]}
    indexes = Indexes(jobs=jobs, pods={key: [_pod("j-launcher-abcde", ["launcher"])]})
    watcher = _watcher(kube, indexes)
    asyncio.run(watcher.scan(100.0))
    assert kube.reads == ["j-launcher-abcde"] and not kube.patches
    # Before the next look is due the job finishes, the line now in the log.
    kube.logs["j-launcher-abcde"] += STAMPED
    jobs[key] = [_job("Succeeded")]
    asyncio.run(watcher.scan(100.5))
    assert kube.patches == [{"firstStepTime": "2026-12-01T11:03:31Z"}]
    assert kube.events == ["TrainingStarted"]
    # Looked at once after the end, not again.
    asyncio.run(watcher.scan(200.0))
    assert len(kube.reads) == 2


def test_a_job_first_seen_finished_is_not_read() -> None:
    # An operator (re)started after the job ended: its pods may be long gone,
    # and "now" would not be its first step.
    kube = _Kube({"j-launcher-abcde": STAMPED})
    key = ("ns", "j")
    indexes = Indexes(
        jobs={key: [_job("Succeeded")]}, pods={key: [_pod("j-launcher-abcde", ["launcher"])]}
    )
    asyncio.run(_watcher(kube, indexes).scan(100.0))
    assert kube.reads == [] and kube.patches == []
