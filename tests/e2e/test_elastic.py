"""Elastic jobs as local processes: a worker lost mid-training, a worker gained.

The job's pods run on the node agent's two nodes (2 pretend GPUs each) in
their own network namespaces, as uid 1000 with no sshd: the launcher runs
Horovod's elastic driver (horovod_worker.elastic_launcher), each worker pod its
agent (horovod_worker.elastic_agent), and the trainer runs under
hvd.elastic.run (horovod_worker.torch_elastic). The real kube-scheduler decides
where replacements and newcomers go, so capacity is made scarce for real: the
nodes cordoned, or a pod holding GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.prerequisites import require_module

# Before the imports below: horovod_worker.elastic_launcher imports Horovod.
require_module("horovod.runner")

from horovod_worker.elastic_launcher import VERBOSE_ENV
from horovod_worker.preemption import FINISH_FILE_ENV
from localcluster.poll import wait_for
from tests.e2e.test_gloo import gloo_job, processes
from tests.e2e.test_horovodjob import (
    ACCURACY_BAR,
    assert_first_step_recorded,
    result,
    wait_finished,
)
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import Agent, local_pod, pod_phase

# Epochs enough that no test's change lands after the end: the run ends when the
# test creates the finish file (HVJOB_FINISH_FILE), never on a clock.
UNTIL_TOLD = 100_000


class FinishGate:
    """A host folder every worker mounts at /gate: the test creates /gate/finish
    when what it wants to see has happened, and the ranks end after that epoch."""

    def __init__(self, folder: Path) -> None:
        folder.chmod(0o755)  # the ranks run as uid 1000
        self.folder = folder

    def open(self) -> None:
        (self.folder / "finish").write_text("")


@pytest.fixture
def gate(tmp_path: Path) -> FinishGate:
    return FinishGate(tmp_path)


def elastic_job(name: str, replicas: int, gate: FinishGate) -> dict[str, Any]:
    job = gloo_job(name, replicas=replicas, extra_args=(f"--epochs={UNTIL_TOLD}",))
    job["spec"]["elastic"] = {"minReplicas": 1, "maxReplicas": 3}
    # Every 10 steps a commit (a reset loses at most that many), and a look at SIGTERM.
    spec = job["spec"]["worker"]["template"]["spec"]
    container = spec["containers"][0]
    container["env"] = [
        {"name": "HVJOB_COMMIT_EVERY", "value": "10"},
        {"name": "HVJOB_STOP_CHECK_EVERY", "value": "5"},
        {"name": FINISH_FILE_ENV, "value": "/gate/finish"},
    ]
    container["volumeMounts"] = [{"name": "gate", "mountPath": "/gate", "readOnly": True}]
    spec["volumes"] = [{"name": "gate", "hostPath": {"path": str(gate.folder)}}]
    # Horovod's driver says what it notifies the ranks of (in the launcher's log).
    launcher = job["spec"]["launcher"]["template"]["spec"]
    launcher["containers"] = [{"name": "launcher", "env": [{"name": VERBOSE_ENV, "value": "2"}]}]
    return job


def log_of(agent: Agent, namespace: str, pod: str) -> str:
    return agent.cli("logs", pod, "-n", namespace, check=False)


def describe(cluster: KubeCluster, agent: Agent, namespace: str, name: str) -> str:
    job = cluster.kubectl("get", "hj", name, "-n", namespace, "-o", "yaml", check=False).stdout
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    logs = [f"launcher:\n{log_of(agent, namespace, f'{name}-launcher')[-4000:]}"]
    logs += [
        f"worker-{i}:\n{log_of(agent, namespace, f'{name}-worker-{i}')[-2500:]}" for i in range(3)
    ]
    return "\n".join([job, pods, *logs])


def rank0_log(agent: Agent, namespace: str, name: str, text: str = " epoch ") -> str:
    """The log of the worker rank 0 trains in (the lowest index Ready at the start;
    the scheduler decides which workers that is), once it holds `text`."""
    logs = [log_of(agent, namespace, f"{name}-worker-{i}") for i in range(3)]
    return next((log for log in logs if "HVJOB_RANK rank=0 " in log and text in log), "")


def events(cluster: KubeCluster, namespace: str, reason: str) -> list[str]:
    items = cluster.get("events", namespace=namespace)["items"]
    return [e["message"] for e in items if e["reason"] == reason]


def epoch_at_size(log: str, size: int) -> bool:
    """Whether rank 0 logged the end of an epoch trained at `size` ranks."""
    return any(" epoch " in line and line.endswith(f" size={size}") for line in log.splitlines())


def started_ranks(log: str) -> int:
    """How many rank processes this worker's agent started."""
    return log.count("elastic_agent: slot 0: started rank")


@pytest.fixture
def cordoned(cluster: KubeCluster) -> Iterator[list[str]]:
    """The agent's nodes, made unschedulable on request, and schedulable again after."""
    nodes: list[str] = []
    yield nodes
    for node in nodes:
        cluster.kubectl("uncordon", node, check=False)


def test_an_elastic_job_loses_a_worker_and_finishes_smaller_without_a_restart(
    cluster: KubeCluster,
    agent: Agent,
    operator: Path,
    namespace: str,
    cordoned: list[str],
    gate: FinishGate,
) -> None:
    name = "elastic-shrink"
    cluster.apply(elastic_job(name, replicas=3, gate=gate), namespace)
    wait_for(
        lambda: f" epoch 3/{UNTIL_TOLD} " in log_of(agent, namespace, f"{name}-worker-0"),
        300, 0.5, "rank 0's third epoch at size 3",
    )  # fmt: skip
    assert "training at 3 rank(s)" in log_of(agent, namespace, f"{name}-launcher")
    # No room for a replacement anywhere: it waits, and the job goes on with two.
    nodes = sorted(
        {p["spec"]["nodeName"] for p in cluster.get("pods", namespace=namespace)["items"]}
    )
    for node in nodes:
        cluster.kubectl("cordon", node)
        cordoned.append(node)
    cluster.kubectl("delete", "pod", f"{name}-worker-2", "-n", namespace, "--wait=false")

    def smaller() -> dict[str, Any] | None:
        status = cluster.get("hj", name, namespace)["status"]
        message = status.get("message", "")
        # The size, and what the replacement waits for.
        wanted = ("training with 2 of 3 worker(s) ready", f"waiting: pod {name}-worker-2:")
        return status if all(part in message for part in wanted) else None

    wait_for(smaller, 120, 0.5, "the job to say it trains with 2 of 3 and why")
    # An epoch at size 2, then the end.
    wait_for(
        lambda: epoch_at_size(rank0_log(agent, namespace, name), 2),
        120, 0.5, "an epoch at size 2",
    )  # fmt: skip
    gate.open()

    job = wait_finished(cluster, namespace, name, 600)
    detail = describe(cluster, agent, namespace, name)
    status = job["status"]
    assert status["phase"] == "Succeeded", detail
    assert status["restarts"] == 0, detail
    lost = status["elastic"]["lostWorkers"]
    assert [(w["pod"], w["reason"], w["counted"]) for w in lost] == [
        (f"{name}-worker-2", "PodDeleted", False)
    ], detail
    assert any(
        f"worker pod {name}-worker-2 lost" in m for m in events(cluster, namespace, "WorkerLost")
    )
    assert any("2 worker(s) ready, was 3" in m for m in events(cluster, namespace, "Resized"))

    launcher = log_of(agent, namespace, f"{name}-launcher")
    assert "training at 2 rank(s)" in launcher, launcher
    assert "training finished" in launcher, launcher
    log0 = log_of(agent, namespace, f"{name}-worker-0")
    summary = result(log0)
    assert summary["elastic"]["sizes"] == [3, 2], summary["elastic"]
    assert summary["size"] == 2 and summary["test_accuracy"] >= ACCURACY_BAR, summary
    # The two that stayed never restarted: one rank process each, all along.
    assert started_ranks(log0) == 1, log0[-3000:]
    assert started_ranks(log_of(agent, namespace, f"{name}-worker-1")) == 1
    # Every rank agrees on the final parameters.
    assert len(set(summary["param_checksums"])) == 1, summary["param_checksums"]
    assert_first_step_recorded(cluster, namespace, name)


def test_an_elastic_job_grows_when_a_node_frees_its_gpus(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str, gate: FinishGate
) -> None:
    name = "elastic-grow"
    # Two of the four GPUs held: the job starts with 2 workers, the third waits.
    holder = local_pod(
        "gpu-holder", "sleep 600", container={"resources": {"limits": {"nvidia.com/gpu": 2}}}
    )
    cluster.apply(holder, namespace)
    pod_phase(cluster, namespace, "gpu-holder", "Running")
    # The run trains until the newcomer has joined and trained an epoch at size 3
    # (joining takes the holder's exit, a scheduling retry, the pod's start, its
    # agent's start and a discovery round: a fixed epoch count raced it).
    cluster.apply(elastic_job(name, replicas=2, gate=gate), namespace)
    wait_for(
        lambda: rank0_log(agent, namespace, name, f" epoch 3/{UNTIL_TOLD} "),
        300, 0.5, "rank 0's third epoch at size 2",
    )  # fmt: skip
    # The scheduler chose which worker waits.
    pending = [
        p["metadata"]["name"]
        for p in cluster.get("pods", namespace=namespace, selector="horovod.ai/role=worker")[
            "items"
        ]
        if p["status"]["phase"] == "Pending"
    ]
    assert len(pending) == 1, pending
    newcomer = pending[0]
    status = cluster.get("hj", name, namespace)["status"]
    assert status["phase"] == "Running", status
    assert f"waiting: pod {newcomer}:" in status["message"], status
    assert not [p for p in processes(agent, namespace) if p["pod"] == newcomer]

    cluster.kubectl("delete", "pod", "gpu-holder", "-n", namespace, "--wait=false")
    wait_for(
        lambda: epoch_at_size(rank0_log(agent, namespace, name), 3),
        300, 0.5, "an epoch at size 3 after the newcomer joined",
    )  # fmt: skip
    gate.open()
    job = wait_finished(cluster, namespace, name, 600)
    detail = describe(cluster, agent, namespace, name)
    status = job["status"]
    assert status["phase"] == "Succeeded", detail
    assert status["restarts"] == 0 and status["elastic"]["resizes"] >= 1, detail
    assert any("3 worker(s) ready, was 2" in m for m in events(cluster, namespace, "Resized"))
    launcher = log_of(agent, namespace, f"{name}-launcher")
    assert "training at 2 rank(s)" in launcher and "training at 3 rank(s)" in launcher, launcher
    summary = result(rank0_log(agent, namespace, name, "HVJOB_RESULT"))
    assert summary["elastic"]["sizes"] == [2, 3], summary["elastic"]
    assert summary["test_accuracy"] >= ACCURACY_BAR, summary
    assert len(set(summary["param_checksums"])) == 1, summary["param_checksums"]
    # The newcomer's agent started its rank once, when the driver took it in.
    assert started_ranks(log_of(agent, namespace, newcomer)) == 1
    # Rank 0 was on the first worker Ready at the start, where the operator read it.
    assert_first_step_recorded(cluster, namespace, name)
