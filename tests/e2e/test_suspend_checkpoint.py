"""A suspended job checkpoints on its way out and resumes from that step (gloo mode).

Suspending deletes the pods; the node agent, like a kubelet, sends SIGTERM and
waits the pod's terminationGracePeriodSeconds (30 s by default) before SIGKILL.
gloo_worker forwards the signal to its ranks, which agree on a step, and rank 0
writes a checkpoint of it (horovod_worker/preemption.py) to a volume that outlives
the pods: a hostPath here, a PersistentVolumeClaim in a cluster
(examples/pytorch-digits-pvc.yaml). Resumed, the job continues from that step.
"""

from __future__ import annotations

import re
from pathlib import Path

from localcluster.poll import wait_for
from tests.e2e.test_gloo import describe, gloo_job
from tests.e2e.test_horovodjob import ACCURACY_BAR, result, wait_finished
from tests.support.cluster import KubeCluster
from tests.support.nodeagent import Agent
from tests.support.prerequisites import require_module

torch = require_module("torch")

CHECKPOINTS = "/checkpoints"


def _suspend(cluster: KubeCluster, namespace: str, name: str, suspend: bool) -> None:
    value = "true" if suspend else "false"
    patch = f'{{"spec": {{"runPolicy": {{"suspend": {value}}}}}}}'
    cluster.kubectl("patch", "hvjob", name, "-n", namespace, "--type=merge", "-p", patch)


def test_a_suspended_job_checkpoints_and_resumes_from_that_step(
    cluster: KubeCluster, agent: Agent, operator: Path, namespace: str, tmp_path: Path
) -> None:
    name = "suspend-ckpt"
    store = tmp_path / "checkpoints"
    store.mkdir(mode=0o777)
    store.chmod(0o777)  # the pods run as uid 1000 (gloo mode)
    job = gloo_job(name, extra_args=("--epochs=25", f"--checkpoint-dir={CHECKPOINTS}", "--resume"))
    worker = job["spec"]["worker"]["template"]["spec"]
    worker["volumes"] = [{"name": "checkpoints", "hostPath": {"path": str(store)}}]
    cluster.apply(job, namespace)

    def log0() -> str:
        return agent.cli("logs", f"{name}-worker-0", "-n", namespace, check=False)

    wait_for(lambda: " epoch 2/25 " in log0(), 300, 0.5, "rank 0's second epoch")
    _suspend(cluster, namespace, name, True)
    wait_for(
        lambda: cluster.get("hj", name, namespace)["status"].get("phase") == "Suspended",
        60, 0.5, "Suspended",
    )  # fmt: skip
    selector = f"horovod.ai/job-name={name}"
    wait_for(
        lambda: not cluster.get("pods", namespace=namespace, selector=selector)["items"],
        90, 0.5, "the job's pods to go",
    )  # fmt: skip

    # Rank 0's checkpoint of the step the ranks agreed on, within an epoch.
    preempted = [
        p
        for p in store.glob("checkpoint-*.pt")
        if re.fullmatch(r"checkpoint-\d{4}-\d{6}\.pt", p.name)
    ]
    assert len(preempted) == 1, sorted(p.name for p in store.iterdir())
    state = torch.load(preempted[0], weights_only=True)
    assert state["step"] > 0 and state["batch"] > 0, {
        k: state[k] for k in ("epoch", "step", "batch")
    }

    _suspend(cluster, namespace, name, False)
    finished = wait_finished(cluster, namespace, name, 600)
    log = log0()
    assert finished["status"]["phase"] == "Succeeded", describe(cluster, agent, namespace, name)
    # The step counter continues from the checkpoint, not from 0.
    point = f"(epoch {state['epoch']}, step {state['step']})"
    resumed = f"resumed from {CHECKPOINTS}/{preempted[0].name} {point}"
    assert resumed in log, log[-3000:]
    assert result(log)["test_accuracy"] >= ACCURACY_BAR
