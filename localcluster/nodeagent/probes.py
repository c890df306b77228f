"""Startup, readiness and liveness probes: when each is due, its counters, and its
handler run in the pod.

Each run happens on a thread of its own, as the kubelet runs each probe in its own
goroutine: an exec probe may take seconds (up to its timeoutSeconds), and the pod's
runner must meanwhile notice a container exit or the pod's deletion.

tcpSocket and httpGet connect from inside the pod's network namespace (a
socket made there keeps it); exec runs the command in the container's
namespaces with nsenter.
"""

from __future__ import annotations

import contextlib
import math
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .netns import run_in_netns

Obj = dict[str, Any]
# How much of an httpGet answer is read, as the kubelet does.
PROBE_BODY_LIMIT = 10 * 1024


@dataclass
class Probe:
    """A startup, readiness or liveness probe of one container and its counters.

    As the kubelet's probe workers: each ticks every periodSeconds from when the pod
    was taken on (`ticks_from`). A readiness probe also runs at once when the
    container is seen running (the kubelet triggers it from the status it writes);
    a startup or liveness probe (`ticks_from` set) first runs on the first tick
    after the container started and initialDelaySeconds passed.
    """

    spec: Obj
    # The tick phase of a startup or liveness probe; None: a readiness probe.
    ticks_from: float | None = None
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    ok: bool = False
    # Whether a run is in flight, and the last run's result until it is taken. A
    # run of the container before its restart counts for nothing (its generation).
    _running: bool = False
    _result: bool | None = None
    _generation: int = 0

    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    def restart(self, now: float) -> None:
        """The container (re)started: not ok, first run after initialDelaySeconds (for
        a startup or liveness probe, on the first tick after that)."""
        self.successes = self.failures = 0
        self.ok = False
        self.next_at = now + float(self.spec.get("initialDelaySeconds", 0))
        if self.ticks_from is not None:
            period = self.period()
            ticks = math.ceil(max(0.0, self.next_at - self.ticks_from) / period)
            self.next_at = self.ticks_from + ticks * period
        self._generation += 1
        self._running, self._result = False, None

    def ran(self, now: float) -> None:
        """A run started at `now`: the next one a period later (on its tick)."""
        self.next_at = now + self.period()
        if self.ticks_from is not None:
            period = self.period()
            self.next_at = (
                self.ticks_from + (math.floor((now - self.ticks_from) / period) + 1) * period
            )

    def due(self, now: float) -> bool:
        return now >= self.next_at and not self._running

    def start(self, handler: Callable[[], bool], done: Callable[[], None]) -> None:
        """Run `handler` on a thread; its result waits for take_result, then `done()`."""
        generation = self._generation

        def target() -> None:
            try:
                result = handler()
            except Exception:  # a probe that cannot run is a failed probe
                result = False
            if generation == self._generation:
                self._result, self._running = result, False
            done()

        self._running, self._result = True, None
        threading.Thread(target=target, name="probe", daemon=True).start()

    def take_result(self) -> bool | None:
        """The finished run's result, once; None while none is waiting."""
        result, self._result = self._result, None
        return result

    def record(self, success: bool) -> bool:
        """Count one result; True when it makes the probe fail (failureThreshold reached)."""
        if success:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.ok = True
            return False
        self.failures, self.successes = self.failures + 1, 0
        if self.failures >= int(self.spec.get("failureThreshold", 3)):
            self.ok = False
            return True
        return False


def run(
    probe: Probe, *, netns: str, pod_ip: str, container: Obj, pid: int, env: Mapping[str, str]
) -> bool:
    """Run the probe's handler once against the container (main process `pid`)."""
    handler = probe.spec
    try:
        if "tcpSocket" in handler:
            port = container_port(container, handler["tcpSocket"]["port"])
            host = handler["tcpSocket"].get("host") or pod_ip
            return tcp_probe(netns, host, port, probe.timeout())
        if "httpGet" in handler:
            h = handler["httpGet"]
            return http_probe(
                netns,
                h.get("host") or pod_ip,
                container_port(container, h["port"]),
                h.get("path", "/"),
                probe.timeout(),
            )
        if "exec" in handler:
            proc = subprocess.run(
                ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *handler["exec"]["command"]],
                env=env,
                capture_output=True,
                timeout=probe.timeout(),
            )
            return proc.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def container_port(container: Obj, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def tcp_probe(netns: str, host: str, port: int, timeout: float) -> bool:
    """Can a TCP connection to host:port be opened from inside the namespace?"""
    sock = run_in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    with sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


def http_probe(netns: str, host: str, port: int, path: str, timeout: float) -> bool:
    """An httpGet probe: any status from 200 to 399 is success."""
    sock = run_in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            head = sock.recv(64).decode(errors="replace").split()
        except OSError:
            return False
        # The rest of the answer too, as the kubelet reads it (up to 10 KiB): a
        # probe that hangs up early makes the server's write fail with a reset.
        with contextlib.suppress(OSError):
            received = 64
            while received < PROBE_BODY_LIMIT and (chunk := sock.recv(4096)):
                received += len(chunk)
    return len(head) > 1 and head[1].isdigit() and 200 <= int(head[1]) < 400
