"""An elastic job's processes on this host: the launcher and the workers' agents.

What the operator puts in an elastic job's pods (elastic_launcher in the
launcher, elastic_agent in each worker), run as plain processes on 127.0.0.1,
each agent on a port of its own, so that the training rung runs Horovod's
elastic driver, real ranks and real resets without a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import horovod_contract as contract
from horovod_worker.elastic_agent import PORT_ENV
from localcluster.paths import REPO
from localcluster.processes import free_port


@dataclass
class LocalElasticJob:
    """`workers` agents (started with start_worker) and one launcher."""

    tmp: Path
    command: Sequence[str]
    workers: int
    env: dict[str, str] = field(default_factory=dict)
    rendezvous_port: int = field(default_factory=free_port)
    ports: list[int] = field(default_factory=list)
    agents: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    launcher: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.ports = [free_port() for _ in range(self.workers)]
        lines = "".join(f"127.0.0.1:{port}\n" for port in self.ports)
        (self.tmp / "agents").write_text(lines)

    def _env(self) -> dict[str, str]:
        path = f"{REPO / 'worker'}:{REPO / 'contract'}"
        return {
            **os.environ,
            "PYTHONPATH": path,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "CUDA_VISIBLE_DEVICES": "",
            **self.env,
        }

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_worker(self, index: int) -> None:
        env = {
            **self._env(),
            contract.ENV_GLOO_RENDEZVOUS: f"127.0.0.1:{self.rendezvous_port}",
            contract.ENV_WORKER_INDEX: str(index),
            contract.ENV_WORKER_HOST: f"worker-{index}",
            contract.ENV_SLOTS_PER_WORKER: "1",
            PORT_ENV: str(self.ports[index]),
        }
        with open(self.tmp / f"worker-{index}.log", "ab") as out:
            self.agents[index] = subprocess.Popen(
                [sys.executable, "-m", "horovod_worker.elastic_agent", "--", *self.command],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_launcher(self, np: int, min_np: int = 1, max_np: int | None = None) -> None:
        command = [sys.executable, "-m", "horovod_worker.elastic_launcher"]
        command += ["--agents", str(self.tmp / "agents"), "--np", str(np)]
        command += ["--min-np", str(min_np), "--max-np", str(max_np or self.workers)]
        command += ["--port", str(self.rendezvous_port), "--timeout", "120"]
        with open(self.tmp / "launcher.log", "ab") as out:
            self.launcher = subprocess.Popen(
                command,
                env=self._env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def terminate(self, index: int) -> None:
        """What the kubelet does to a deleted pod: SIGTERM to its main process."""
        self.agents[index].send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.launcher is not None
        code = self.launcher.wait(timeout=timeout)
        for agent in self.agents.values():
            agent.wait(timeout=60)
        return code

    def stop(self) -> None:
        for proc in [*self.agents.values(), *([self.launcher] if self.launcher else [])]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
