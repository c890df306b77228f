"""localcluster.processes: the ports it picks and the machine-wide lock on a fixed one."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcluster.paths import REPO
from localcluster.processes import FREE_PORTS, free_port, port_free, port_held

HOLDER = """
import sys, time
from localcluster.processes import port_held
with port_held(int(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print("released", flush=True)
"""


def test_a_second_holder_of_a_fixed_port_waits_for_the_first() -> None:
    port = free_port()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(port), "1.5"], cwd=REPO, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    began = time.monotonic()
    with port_held(port):
        waited = time.monotonic() - began
        # The first holder let go before this one got the lock.
        assert first.wait(timeout=10) == 0
    assert first.stdout.read() == "released\n"
    assert waited > 0.5, waited


def test_a_free_port_is_one_no_outgoing_connection_can_take() -> None:
    # Outgoing connections take their local ports from the ephemeral range: a port
    # from it could be taken between free_port's answer and the listener's bind.
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert FREE_PORTS.stop <= low
    port = free_port()
    assert port in FREE_PORTS
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not port_free(port)
        # Taken on the loopback: never the answer while it is.
        assert port not in {free_port() for _ in range(300)}


def test_a_free_port_has_no_connection_left_in_time_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that closes first leaves its side of the connection in TIME_WAIT on
    # its port for a minute: a listener with SO_REUSEADDR may bind it, one without
    # may not, so free_port never answers such a port.
    port = free_port()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first: TIME_WAIT is on `port`
        client.close()
    assert port_free(port)  # as a server with SO_REUSEADDR would
    assert not port_free(port, reuse=False)
    # Offered first, it is passed over.
    monkeypatch.setattr(random, "sample", lambda ports, k: [port, *ports[:k]])
    assert free_port() != port
