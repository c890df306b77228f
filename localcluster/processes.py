"""Processes the tooling starts (stop them, read their logs) and the ports they take."""

from __future__ import annotations

import fcntl
import random
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM a process we started, SIGKILL it if it outlives `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


# Where free_port looks: below Linux's ephemeral range (32768-60999 by default), so
# no outgoing connection can take the port between the choice and the listener's
# bind (CI's run of 9b0c53a lost Trainer's webhook port, a kernel-chosen 60611, that
# way); below the NodePort range (30000-32767); above the clusters' fixed bases.
FREE_PORTS: Final = range(20000, 30000)


def free_port() -> int:
    """A port nothing uses now, from FREE_PORTS at random: not even a closed
    connection in TIME_WAIT, so that a listener without SO_REUSEADDR binds it too
    (the kernel's own choice used to promise as much)."""
    for port in random.sample(FREE_PORTS, 200):
        if port_free(port, reuse=False) and port_free(port, "0.0.0.0", reuse=False):
            return port
    raise OSError(f"no free port among 200 tried in {FREE_PORTS}")


def port_free(port: int, host: str = "127.0.0.1", reuse: bool = True) -> bool:
    """Whether `port` can be bound on `host` now (`reuse`: as a listener with
    SO_REUSEADDR, which a connection in TIME_WAIT does not stop)."""
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@contextmanager
def port_held(port: int) -> Iterator[None]:
    """Hold a machine-wide lock on a fixed port (one a program serves on, unchangeable,
    such as mpi-operator's /healthz) while using it: hack/test.sh runs two pytest
    streams side by side, and two tests that need the same fixed port wait for each
    other instead of failing on a taken port."""
    with open(f"/tmp/horovod-operator-port-{port}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another test that uses port {port} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def http_ok(url: str, timeout: float = 2, context: ssl.SSLContext | None = None) -> bool:
    """Whether `url` answers 200 now (a health or readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class ManagedProcess:
    """One program the tooling runs beside a cluster (a scheduler, Kueue, a controller
    manager, an operator): started with its output in a log file, checked for an early
    exit while it is awaited, stopped with SIGTERM then SIGKILL."""

    name = "the process"  # in messages: "<name> exited (1)", "<name> was not started"
    error: type[Exception] = RuntimeError

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise self.error(f"{self.name} was not started")
        return self.proc.pid

    def launch(
        self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
            )

    def check_running(self) -> None:
        """Raise, with the end of its log, when it has exited (it should not have)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def stop(self, timeout: float = 15) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)
