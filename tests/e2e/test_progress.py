"""Progress, hangs and the world-size guard, with real ranks on the node agent's pods.

The operator reads rank 0's log through the API server and the agent's log endpoint
(the kubelet's sinceTime and limitBytes), as on a cluster (docs/progress.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from localcluster.operator import OperatorProcess
from localcluster.poll import wait_for
from tests.e2e.test_horovodjob import _describe, _trainer_pids, example_job, wait_finished
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import Agent

DEADLINE = 60
# A hang is found within a read interval (a quarter of the deadline) of the deadline,
# plus the status write, the reconcile and the pods' ends.
SLACK = DEADLINE / 4 + 20
# A record comes every 10 s: the last one before the stop can be that old.
RECORD_INTERVAL = 10


def _progress(cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any]:
    status = cluster.get("hj", name, namespace).get("status") or {}
    progress: dict[str, Any] = status.get("progress") or {}
    return progress


def _log_reads(operator_process: OperatorProcess) -> float:
    """Pod-log GETs the operator process has sent so far (its /metrics; 0 before any)."""
    lines = [
        line
        for line in operator_process.metrics().splitlines()
        if line.startswith("horovod_operator_api_requests_total{")
        and 'verb="GET"' in line
        and 'kind="PodLog"' in line
    ]
    assert len(lines) <= 1, lines
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_progress_moves_then_a_stopped_rank_ends_the_attempt_as_hung(
    cluster: KubeCluster,
    agent: Agent,
    operator_process: OperatorProcess,
    namespace: str,
) -> None:
    name = "hung"
    job = example_job("pytorch", name, extra_args=("--epochs=5000",), backoff_limit=0)
    job["spec"]["runPolicy"]["progressDeadlineSeconds"] = DEADLINE
    cluster.apply(job, namespace)

    def describe() -> str:
        return _describe(cluster, agent, namespace, name)

    first = wait_for(
        lambda: _progress(cluster, namespace, name).get("step"), 300, 1.0, "a first step",
        describe=describe,
    )  # fmt: skip
    progress = _progress(cluster, namespace, name)
    assert progress["worldSize"] == 2 and progress["attempt"] == 0, progress
    assert progress.get("samplesPerSecond") is None or progress["samplesPerSecond"] > 0
    # Progress moves in the status while the job trains (a write at most every 30 s).
    wait_for(
        lambda: (_progress(cluster, namespace, name).get("step") or 0) > first,
        90,
        1.0,
        "status.progress.step to move",
        describe=describe,
    )
    victims = _trainer_pids(agent, namespace, f"{name}-worker-1")
    assert victims, describe()
    stopped = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGSTOP)
    try:
        # An operator restart in the middle: the new process picks up from the
        # status (the step's last move) and reads the log from there.
        operator_process.stop(timeout=30)
        operator_process.start_and_wait(timeout=60)
        reads_before, window_start = _log_reads(operator_process), time.monotonic()
        done = wait_finished(cluster, namespace, name, DEADLINE + SLACK + 60)
        found_after = time.monotonic() - stopped
    finally:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    status = done["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Hung"), describe()
    # Named: rank 1 in its pod. A stopped process blocks Horovod's negotiation too, so
    # its stall inspector cannot tell; rank 0 says it waits, rank 1 says nothing.
    assert f"rank 1 ({name}-worker-1) printed nothing" in status["message"], status["message"]
    assert [f["pod"] for f in status["failures"]] == [f"{name}-worker-1"], status
    hung = status["progress"]["hung"]
    assert hung["ranks"] == [1] and hung["pods"] == [f"{name}-worker-1"], hung
    # Within the deadline plus the stated slack, and not before the deadline.
    print(f"hang found {found_after:.1f}s after the stop (deadline {DEADLINE}s)")
    assert DEADLINE - RECORD_INTERVAL <= found_after <= DEADLINE + SLACK, found_after
    # The cost: one log read per read interval, whatever the number of workers.
    minutes = (time.monotonic() - window_start) / 60
    reads = _log_reads(operator_process) - reads_before
    assert 1 <= reads <= minutes * 60 / (DEADLINE / 4) + 2, (reads, minutes)


TWO_WORLDS = """\
import os, time
# Each process ignores the launcher's world and starts its own: the Gloo
# controller without a rendezvous makes a world of one (a mistake, made on purpose).
os.environ["HOROVOD_CONTROLLER"] = "gloo"
os.environ["HOROVOD_CPU_OPERATIONS"] = "gloo"
import horovod.torch as hvd
from horovod_contract.progress import ProgressReporter
hvd.init()
progress = ProgressReporter(hvd.rank(), hvd.size(), interval=1.0)
for step in range(1, 3000):
    progress.step(step, samples=step * 32)
    time.sleep(0.1)
"""


def test_ranks_that_form_two_worlds_fail_the_job_with_both_sizes(
    cluster: KubeCluster, agent: Agent, operator_process: OperatorProcess, namespace: str
) -> None:
    """A script of one's own (not a built-in trainer, which checks its size itself)."""
    name = "two-worlds"
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "script"},
         "data": {"two_worlds.py": TWO_WORLDS}},
        namespace,
    )  # fmt: skip
    job = example_job("pytorch", name, backoff_limit=0)
    job["spec"]["command"] = ["python", "/scripts/two_worlds.py"]
    pod_spec = job["spec"]["worker"]["template"]["spec"]
    pod_spec["volumes"].append({"name": "scripts", "configMap": {"name": "script"}})
    pod_spec["containers"][0]["volumeMounts"].append({"name": "scripts", "mountPath": "/scripts"})
    applied = time.monotonic()
    cluster.apply(job, namespace)
    done = wait_finished(cluster, namespace, name, 300)
    status = done["status"]
    detail = _describe(cluster, agent, namespace, name)
    assert (status["phase"], status["reason"]) == ("Failed", "WrongWorldSize"), detail
    assert "world of 1 but the job runs 2" in status["message"], status["message"]
    # Long before the script's five minutes are over.
    assert time.monotonic() - applied < 150, detail
