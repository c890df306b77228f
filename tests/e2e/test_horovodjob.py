"""Whole HorovodJobs run as local processes: operator, launcher, workers, real ssh, real training.

Every pod runs in its own network, UTS and mount namespace on the node agent's
nodes, so the launcher's horovodrun reaches each worker's sshd by its DNS name
(`<job>-worker-<i>.<job>-worker.<ns>.svc`), exactly as in a cluster.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from horovod_contract.rank_output import rank_lines, split_by_rank
from horovod_worker.common import parse_result
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import LOCAL_PLACEMENT, Agent, alive
from tests.support.timings import record_timing

ACCURACY_BAR = 0.90
RANK_LINE = re.compile(
    r"HVJOB_RANK rank=(\d+) size=(\d+) local_rank=(\d+) local_size=(\d+) hostname=(\S+)"
)
CHECKPOINT_DIR = "/checkpoints"


def example_job(
    framework: str,
    name: str,
    *,
    example: str | None = None,
    replicas: int = 2,
    slots: int = 1,
    extra_args: tuple[str, ...] = (),
    backoff_limit: int | None = None,
) -> dict[str, Any]:
    """examples/<framework>-digits.yaml (or examples/<example>.yaml), placed on the
    agent's nodes through the templates."""
    job: dict[str, Any] = yaml.safe_load(
        (REPO / "examples" / f"{example or framework + '-digits'}.yaml").read_text()
    )
    job["metadata"]["name"] = name
    spec = job["spec"]
    # The agent ignores images; this rung's operator has no default one.
    spec.setdefault("image", "horovod-worker:e2e")
    spec["command"] = [*spec["command"], "--threads=1", *extra_args]
    spec["slotsPerWorker"] = slots
    spec["worker"]["replicas"] = replicas
    spec["worker"]["resources"] = {"limits": {"nvidia.com/gpu": slots}}
    # Worker pods keep running after success so that each one's checkpoint dir
    # (an emptyDir: a pod's own) can be inspected.
    spec["runPolicy"]["cleanPodPolicy"] = "None"
    if backoff_limit is not None:
        spec["runPolicy"]["backoffLimit"] = backoff_limit
    spec["worker"]["template"] = {
        "spec": {
            **copy.deepcopy(LOCAL_PLACEMENT),
            "volumes": [{"name": "checkpoints", "emptyDir": {}}],
            "containers": [
                {
                    "name": "worker",
                    "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINT_DIR}],
                }
            ],
        }
    }
    spec["launcher"] = {"template": {"spec": copy.deepcopy(LOCAL_PLACEMENT)}}
    return job


def wait_finished(cluster: KubeCluster, namespace: str, name: str, timeout: float) -> Any:
    def done() -> Any:
        job = cluster.get("hj", name, namespace)
        return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    return wait_for(done, timeout, 1.0, f"HorovodJob {name} to finish")


def assert_first_step_recorded(cluster: KubeCluster, namespace: str, name: str) -> None:
    """status.firstStepTime within the job's run, and the TrainingStarted Event
    (the operator's time to first step, read from rank 0's log: progress.py).

    A job that finishes between two of the watcher's looks gets its last look on
    the watcher's next tick after Succeeded, so the field and the Event may land a
    moment after the phase: waited for, briefly, rather than read once."""

    def started_events() -> list[Any]:
        events = cluster.get("events", namespace=namespace)["items"]
        return [e for e in events if e["reason"] == "TrainingStarted"]

    def recorded() -> Any:
        status = cluster.get("hj", name, namespace)["status"]
        return status if status.get("firstStepTime") and started_events() else None

    status = wait_for(
        recorded,
        20,
        0.5,
        f"status.firstStepTime and the TrainingStarted Event of {name}",
        describe=lambda: str(cluster.get("hj", name, namespace)["status"]),
    )
    first = status["firstStepTime"]
    assert status["startTime"] <= first <= status["completionTime"], status
    started = started_events()
    assert [e["involvedObject"]["name"] for e in started] == [name], started
    assert "rank 0 started training" in started[0]["message"]


def ranks(launcher_log: str) -> list[dict[str, Any]]:
    out = []
    for _, line in split_by_rank(launcher_log):
        m = RANK_LINE.search(line)
        if m is None:
            continue
        rank, size, local_rank, local_size, host = m.groups()
        out.append(
            {
                "rank": int(rank),
                "size": int(size),
                "local_rank": int(local_rank),
                "local_size": int(local_size),
                "hostname": host,
            }
        )
    return sorted(out, key=lambda r: r["rank"])


def result(launcher_log: str) -> dict[str, Any]:
    try:
        return parse_result(launcher_log)
    except ValueError as exc:
        raise AssertionError(f"{exc}; the launcher's log:\n{launcher_log[-3000:]}") from None


def _launcher_log(agent: Agent, namespace: str, name: str) -> str:
    """The log of the job's launcher pod so far ("" before it has one)."""
    return agent.cli("logs", f"{name}-launcher", "-n", namespace, check=False)


def _seconds_to_first_rank_line(
    cluster: KubeCluster, agent: Agent, namespace: str, name: str, applied: float
) -> float | None:
    """Seconds from apply until a rank's start line (Horovod initialised, the first
    step next) is in the launcher's log, polled every 0.25 s; None when the job
    ended without one. (The operator reads the log with timestamps, which the node
    agent's log endpoint gives to within its clock's period, logserver.LogClock.)"""

    def seen() -> tuple[float | None] | None:
        if RANK_LINE.search(_launcher_log(agent, namespace, name)):
            return (round(time.monotonic() - applied, 1),)
        phase = cluster.get("hj", name, namespace).get("status", {}).get("phase")
        return (None,) if phase in ("Succeeded", "Failed") else None

    found: tuple[float | None] = wait_for(seen, 600, 0.25, f"{name}'s first rank line")
    return found[0]


def _describe(cluster: KubeCluster, agent: Agent, namespace: str, name: str) -> str:
    job = cluster.kubectl("get", "hj", name, "-n", namespace, "-o", "yaml", check=False).stdout
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    log = _launcher_log(agent, namespace, name)
    return f"{job}\n{pods}\nlauncher log:\n{log[-4000:]}"


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_example_2x1_over_ssh(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str, framework: str
) -> None:
    name = f"{framework[:5]}-digits"
    applied = time.monotonic()
    cluster.apply(
        example_job(framework, name, extra_args=(f"--checkpoint-dir={CHECKPOINT_DIR}",)),
        namespace,
    )
    started = _seconds_to_first_rank_line(cluster, agent, namespace, name, applied)
    job = wait_finished(cluster, namespace, name, 600)
    assert job["status"]["phase"] == "Succeeded", _describe(cluster, agent, namespace, name)
    # The node-agent rung's side of the kind rung's timings (docs/dev/kind-node-image.md).
    record_timing(
        "node-agent",
        name,
        apply_to_trainers_started_s=started,
        apply_to_finished_s=round(time.monotonic() - applied, 1),
    )
    log = agent.cli("logs", f"{name}-launcher", "-n", namespace)
    assert result(log)["test_accuracy"] >= ACCURACY_BAR
    assert_first_step_recorded(cluster, namespace, name)
    # The launcher reached the workers over ssh that checked the job's host key.
    assert "ssh client configured (verifies the job's host key)" in log, log[:2000]
    seen = ranks(log)
    assert [r["rank"] for r in seen] == [0, 1], log[-3000:]
    hosts = {r["hostname"] for r in seen}
    assert hosts == {f"{name}-worker-0", f"{name}-worker-1"}, "each rank in its own pod"
    # kubectl logs works too: the API server reads them from the agent's log endpoint.
    launcher_pods = cluster.get("pods", namespace=namespace, selector="job-name")["items"]
    via_api = cluster.kubectl("logs", "-n", namespace, launcher_pods[0]["metadata"]["name"])
    assert "HVJOB_RESULT" in via_api.stdout
    # Only rank 0's pod has checkpoints in its (private) checkpoint dir.
    rank0_host = next(r["hostname"] for r in seen if r["rank"] == 0)
    for i in range(2):
        pod = f"{name}-worker-{i}"
        files = agent.exec(pod, namespace, "ls", CHECKPOINT_DIR).split()
        if pod == rank0_host:
            assert files, f"rank 0 ({pod}) wrote no checkpoint"
        else:
            assert files == [], f"{pod} is not rank 0 but wrote {files}"


def test_two_workers_two_slots_each(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "torch-2x2"
    cluster.apply(example_job("pytorch", name, slots=2, extra_args=("--epochs=1",)), namespace)
    job = wait_finished(cluster, namespace, name, 600)
    assert job["status"]["phase"] == "Succeeded", _describe(cluster, agent, namespace, name)
    seen = ranks(agent.cli("logs", f"{name}-launcher", "-n", namespace))
    assert [r["rank"] for r in seen] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["local_size"] == 2 for r in seen)
    by_host: dict[str, list[int]] = {}
    for r in seen:
        by_host.setdefault(r["hostname"], []).append(r["local_rank"])
    assert by_host == {f"{name}-worker-0": [0, 1], f"{name}-worker-1": [0, 1]}


def _trainer_pids(agent: Agent, namespace: str, pod: str) -> list[int]:
    info = agent.pod_info(pod, namespace)
    if not info:
        return []
    out = []
    for pid in info["pids"]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"horovod_worker.train" in cmdline and b"horovodrun" not in cmdline:
            out.append(pid)
    return out


def test_worker_killed_mid_training_restarts_the_job(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "killed"
    # An epoch of digits takes 0.02-0.1 s here: enough of them that training outlasts
    # the polls below by seconds.
    epochs = 200
    cluster.apply(
        example_job("pytorch", name, extra_args=(f"--epochs={epochs}",), backoff_limit=2),
        namespace,
    )
    victim = f"{name}-worker-1"
    pids = wait_for(lambda: _trainer_pids(agent, namespace, victim), 300, 0.5, "a rank running")
    # Mid-training: rank 0 logged its first epoch, which needed every rank's gradients.
    # (A fixed sleep here once killed the ranks while they still imported their frameworks.)
    wait_for(
        lambda: any(
            f" epoch 1/{epochs} " in line
            for line in rank_lines(_launcher_log(agent, namespace, name), 0)
        ),
        300,
        0.2,
        "rank 0's first epoch in the launcher's log",
    )
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    job = wait_finished(cluster, namespace, name, 600)
    status = job["status"]
    detail = _describe(cluster, agent, namespace, name)
    if status["phase"] == "Succeeded":
        assert status.get("restarts", 0) >= 1, detail
    else:
        failures = status.get("failures") or []
        assert failures, detail
        assert any(f.get("exitCode") not in (None, 0) for f in failures), detail


def test_command_exiting_3_fails_the_job_and_keeps_the_launcher_log(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "exit-three"
    job = example_job("pytorch", name, backoff_limit=0)
    job["spec"]["command"] = ["sh", "-c", "echo rank says goodbye; exit 3"]
    job["spec"]["launcher"]["template"]["spec"]["containers"] = [
        {
            "name": "launcher",
            "command": ["sh", "-c", "echo launcher line one; echo launcher last words; exit 3"],
        }
    ]
    cluster.apply(job, namespace)
    done = wait_finished(cluster, namespace, name, 300)
    status = done["status"]
    detail = _describe(cluster, agent, namespace, name)
    assert status["phase"] == "Failed", detail
    assert status["launcher"]["exitCode"] == 3, detail
    # The launcher's last lines outlive its pod: the operator keeps them (status,
    # Event or ConfigMap). Delete the pods, then look for them in every place.
    cluster.kubectl("delete", "pods", "-n", namespace, "--all", "--wait=true", "--timeout=60s")
    kept = "\n".join(
        [
            json.dumps(cluster.get("hj", name, namespace).get("status", {})),
            cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout,
            cluster.kubectl("get", "configmaps", "-n", namespace, "-o", "json").stdout,
        ]
    )
    assert "launcher last words" in kept, detail


def test_deleting_a_running_job_stops_every_process(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "deleted"
    cluster.apply(example_job("pytorch", name, extra_args=("--epochs=50",)), namespace)
    wait_for(lambda: _trainer_pids(agent, namespace, f"{name}-worker-0"), 300, 0.5, "training")
    ours = [i for i in agent.ps() if i["namespace"] == namespace]
    netns = {i["netns"] for i in ours}
    pids = {p for i in ours for p in i["pids"]}
    assert len(ours) >= 3 and pids
    cluster.kubectl("delete", "hj", name, "-n", namespace, "--wait=false")
    wait_for(lambda: not cluster.get("pods", namespace=namespace)["items"], 120, 0.5, "pods gone")
    wait_for(lambda: not (netns & set(agent.netns())), 30, 0.3, "namespaces removed")
    left = [p for p in pids if alive(p)]
    assert left == [], f"processes left: {left}"
