"""The operator as a local process: the one launcher the tests, the demo's
benchmarks and the soak use (argv, start, readiness, stop, log tail)."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .paths import REPO
from .processes import ManagedProcess, free_port, http_ok


class OperatorProcess(ManagedProcess):
    """`python -m horovod_operator` watching some namespaces, its log in a file."""

    name = "the operator"

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        log_path: Path,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.extra_args = list(extra_args)
        self.python = python
        self.port = free_port()
        self.label = "horovod-operator"

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
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        self.launch(self.argv(), env=env, cwd=REPO)

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.port}/readyz", timeout=1)

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
        super().stop(timeout)
