"""The operator as a local process: the one launcher the tests, the demo's
benchmarks and the soak use (argv, start, readiness, stop, log tail)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .paths import REPO
from .processes import free_port, log_tail, stop_process


class OperatorProcess:
    """`python -m horovod_operator` watching some namespaces, its log in a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        log_path: Path,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.python = python
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.label = "horovod-operator"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the operator was not started")
        return self.proc.pid

    @property
    def pids(self) -> list[int]:
        """The processes whose CPU and memory are this operator's (one here)."""
        return [self.pid]

    def argv(self) -> list[str]:
        return [
            self.python,
            "-m",
            "horovod_operator",
            *(arg for ns in self.namespaces for arg in ("--namespace", ns)),
            "--kubeconfig",
            str(self.kubeconfig),
            "--http-port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start without waiting (tests that race the operator's start need that)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
            )

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def start_and_wait(self, timeout: float = 90) -> float:
        """Start and wait until /readyz answers; returns the seconds that took."""
        started = time.monotonic()
        self.start()
        assert self.proc is not None
        while time.monotonic() < started + timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited ({self.proc.returncode}) at start:\n{self.tail()}"
                )
            if self.ready():
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{self.label} was not ready after {timeout:.0f}s:\n{self.tail()}")

    def metrics(self) -> str:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as response:
                text: str = response.read().decode()
                return text
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no clean-up handlers, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)
