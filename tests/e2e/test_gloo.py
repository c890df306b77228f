"""launchMode: gloo, whole jobs as local processes: no ssh, no keys, a non-root uid.

Like test_horovodjob.py, every pod runs in its own network, UTS and mount
namespace on the node agent's nodes: each worker finds the launcher's
rendezvous server by its DNS name (`<job>-launcher.<job>-worker.<ns>.svc`),
starts its own ranks, and the ranks reach each other over the pod network.
The agent runs each container as its securityContext's user (runAsNonRoot with
no user: uid 1000, the worker image's), and the API server enforces
PodSecurity for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from horovod_contract.rank_output import rank_lines
from localcluster.poll import wait_for
from tests.e2e.test_horovodjob import (
    ACCURACY_BAR,
    assert_first_step_recorded,
    example_job,
    ranks,
    result,
    wait_finished,
)
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import LOCAL_PLACEMENT, Agent

EXAMPLE = "pytorch-digits-gloo"


def gloo_job(name: str, **kw: Any) -> dict[str, Any]:
    job = example_job("pytorch", name, example=EXAMPLE, **kw)
    assert job["spec"]["launchMode"] == "gloo"
    return job


def worker_logs(agent: Agent, namespace: str, name: str, replicas: int = 2) -> list[str]:
    return [
        agent.cli("logs", f"{name}-worker-{i}", "-n", namespace, check=False)
        for i in range(replicas)
    ]


def describe(cluster: KubeCluster, agent: Agent, namespace: str, name: str) -> str:
    job = cluster.kubectl("get", "hj", name, "-n", namespace, "-o", "yaml", check=False).stdout
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    logs = [f"launcher:\n{agent.cli('logs', f'{name}-launcher', '-n', namespace, check=False)}"]
    logs += [
        f"worker-{i}:\n{log[-3000:]}" for i, log in enumerate(worker_logs(agent, namespace, name))
    ]
    return "\n".join([job, pods, *logs])


def processes(agent: Agent, namespace: str) -> list[dict[str, Any]]:
    """Every process in the namespace's pods: pod, pid, uids, command line."""
    found = []
    for info in agent.ps():
        if info["namespace"] != namespace:
            continue
        for pid in info["pids"]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # ended meanwhile
            uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
            found.append(
                {"pod": info["pod"], "pid": pid, "uids": [int(u) for u in uids], "cmd": cmdline}
            )
    return found


def training(agent: Agent, namespace: str) -> list[dict[str, Any]] | None:
    """The namespace's processes once a rank of every worker trains, else None."""
    seen = processes(agent, namespace)
    busy = {p["pod"] for p in seen if "horovod_worker.train" in p["cmd"] and "gloo" not in p["cmd"]}
    return seen if len(busy) >= 2 else None


def test_gloo_2x1_trains_without_ssh_as_a_non_root_user(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "gloo-digits"
    cluster.apply(gloo_job(name), namespace)
    # While the ranks train: what runs in the job's pods, and as whom.
    seen = wait_for(lambda: training(agent, namespace), 300, 0.3, "both workers' ranks")
    job = wait_finished(cluster, namespace, name, 600)
    detail = describe(cluster, agent, namespace, name)
    assert job["status"]["phase"] == "Succeeded", detail

    pods = {p["pod"] for p in seen}
    assert pods >= {f"{name}-worker-0", f"{name}-worker-1"}, seen
    assert any(pod.startswith(f"{name}-launcher") for pod in pods), seen
    assert not [p for p in seen if "sshd" in p["cmd"] or "orted" in p["cmd"]], seen
    # Real, effective, saved and filesystem uid of every process: the image's user.
    assert all(p["uids"] == [1000] * 4 for p in seen), seen
    assert not cluster.exists("secret", f"{name}-ssh", namespace)

    logs = worker_logs(agent, namespace, name)
    seen_ranks = sorted(ranks(logs[0]) + ranks(logs[1]), key=lambda r: r["rank"])
    assert [(r["rank"], r["size"]) for r in seen_ranks] == [(0, 2), (1, 2)], detail
    # Rank r on worker r: its own pod, hostname and rank environment.
    assert [r["hostname"] for r in seen_ranks] == [f"{name}-worker-0", f"{name}-worker-1"]
    assert result(logs[0])["test_accuracy"] >= ACCURACY_BAR
    launcher_log = agent.cli("logs", f"{name}-launcher", "-n", namespace)
    assert "every worker finished successfully (2)" in launcher_log, launcher_log
    # Rank 0 runs in worker 0: the operator read its first step there.
    assert_first_step_recorded(cluster, namespace, name)


def test_gloo_two_workers_two_slots_each(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "gloo-2x2"
    cluster.apply(gloo_job(name, slots=2, extra_args=("--epochs=1",)), namespace)
    job = wait_finished(cluster, namespace, name, 600)
    detail = describe(cluster, agent, namespace, name)
    assert job["status"]["phase"] == "Succeeded", detail
    logs = worker_logs(agent, namespace, name)
    seen = sorted(ranks(logs[0]) + ranks(logs[1]), key=lambda r: r["rank"])
    assert [r["rank"] for r in seen] == [0, 1, 2, 3], detail
    assert all(r["size"] == 4 and r["local_size"] == 2 for r in seen)
    by_host: dict[str, list[int]] = {}
    for r in seen:
        by_host.setdefault(r["hostname"], []).append(r["local_rank"])
    assert by_host == {f"{name}-worker-0": [0, 1], f"{name}-worker-1": [0, 1]}
    # Ranks 2 and 3 ran in worker 1 (cross rank 1), each line tagged with its rank.
    assert rank_lines(logs[1], 2) and rank_lines(logs[1], 3) and not rank_lines(logs[1], 0)


def test_gloo_rank_exiting_3_fails_the_job_naming_its_worker_pod(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    name = "gloo-exit-three"
    job = gloo_job(name, backoff_limit=0)
    job["spec"]["command"] = [
        "sh",
        "-c",
        'if [ "$HOROVOD_RANK" = 1 ]; then echo rank 1 says goodbye; exit 3; fi; sleep 120',
    ]
    job["spec"]["runPolicy"]["cleanPodPolicy"] = "Running"
    cluster.apply(job, namespace)
    done = wait_finished(cluster, namespace, name, 300)
    status = done["status"]
    detail = describe(cluster, agent, namespace, name)
    assert status["phase"] == "Failed", detail
    failures = status.get("failures") or []
    failed = [f for f in failures if f["pod"] == f"{name}-worker-1"]
    assert failed and failed[0]["exitCode"] == 3, detail
    assert all(f["pod"] != f"{name}-worker-0" for f in failures), detail
    # The worker's last log lines are its termination message, kept in the status.
    assert "rank 1 says goodbye" in (failed[0].get("message") or ""), detail
    condition = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (
        f"pod {name}-worker-1 container worker failed (Error, exit code 3)"
        in (condition["message"])
    )
    # cleanPodPolicy Running: the sleeping worker and the launcher are stopped.
    wait_for(
        lambda: (
            all(
                p.get("status", {}).get("phase") not in ("Pending", "Running")
                or p["metadata"].get("deletionTimestamp")
                for p in cluster.get("pods", namespace=namespace)["items"]
            )
            or None
        ),
        120,
        0.5,
        "running pods cleaned up",
    )


def test_gloo_job_is_admitted_under_pod_security_restricted(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str
) -> None:
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    # The API server enforces it: a pod that is not restricted is refused here.
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            **LOCAL_PLACEMENT,
            "containers": [{"name": "main", "image": "x", "command": ["true"]}],
        },
    }
    refused = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(plain), check=False
    )
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr

    name = "gloo-restricted"
    cluster.apply(gloo_job(name, extra_args=("--epochs=1",)), namespace)
    job = wait_finished(cluster, namespace, name, 600)
    detail = describe(cluster, agent, namespace, name)
    assert job["status"]["phase"] == "Succeeded", detail
    warnings = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "type=Warning", "-o", "json"
    ).stdout
    assert "PodSecurity" not in warnings, warnings
