"""Processes the tooling starts (stop them, read their logs) and the ports they take."""

from __future__ import annotations

import fcntl
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether `port` can be bound on `host` now."""
    with socket.socket() as sock:
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
