"""Helpers for the e2e tests: the node agent handle, local pods, waiting on phases."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.nodeagent.agent import NODE_KIND, NODE_KIND_LABEL, TAINT_KEY, netns_prefix
from localcluster.nodeagent.netns import list_netns
from localcluster.paths import REPO
from localcluster.poll import wait_for
from tests.support.cluster import KubeCluster

PYTHON = REPO / ".venv" / "bin" / "python"
# The agent's entry point: the venv's Python with the repository importable.
AGENT = REPO / "hack" / "nodeagent.sh"

# What a pod or a HorovodJob template needs to run on the agent's nodes.
LOCAL_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {NODE_KIND_LABEL: NODE_KIND},
    "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass
class Agent:
    """The running node agent, and what tests ask of it."""

    state_dir: Path
    log_file: Path
    proc: subprocess.Popen[bytes]

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        proc = subprocess.run(
            [str(AGENT), "--state-dir", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"nodeagent {' '.join(args)}: {proc.stderr}{proc.stdout}")
        return proc.stdout

    def logs(self, pod: str, namespace: str, container: str | None = None) -> str:
        args = ["logs", pod, "-n", namespace]
        if container:
            args += ["-c", container]
        return self.cli(*args)

    def ps(self) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("ps")))

    def pod_info(self, pod: str, namespace: str) -> dict[str, Any] | None:
        return next((i for i in self.ps() if i["pod"] == pod and i["namespace"] == namespace), None)

    def exec(self, pod: str, namespace: str, *command: str, check: bool = True) -> str:
        return self.cli("exec", pod, "-n", namespace, "--", *command, check=check)

    def netns(self) -> list[str]:
        return list_netns(netns_prefix(self.state_dir))

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_file.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def alive(pid: int) -> bool:
    """Running or sleeping; a killed orphan stays a zombie until PID 1 reaps it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def local_pod(name: str, command: str, **spec: Any) -> dict[str, Any]:
    """A pod for the agent's nodes running `sh -c command`."""
    container = {"name": "main", "image": "ignored", "command": ["sh", "-c", command]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            **LOCAL_PLACEMENT,
            "containers": [container],
            **spec,
        },
    }


def pod_phase(cluster: KubeCluster, namespace: str, pod: str, *phases: str) -> dict[str, Any]:
    """Wait until the pod is in one of `phases`; returns the pod."""

    def check() -> dict[str, Any] | None:
        obj = cluster.get("pod", pod, namespace)
        return obj if obj.get("status", {}).get("phase") in phases else None

    return wait_for(check, 60, 0.3, f"pod {namespace}/{pod} in {phases}")
