"""The pod network: one bridge in a network namespace of its own, one namespace per pod.

    host netns (untouched: no address, no route, no link is added here)
    <prefix>-infra netns:  lo, br0 10.250.0.1/16, CoreDNS on :53, vp<N> veth ends
    <prefix>-p<N> netns:   lo, eth0 10.250.x.y/16 (the other end of vp<N>)

No namespace has a default route, so nothing a pod sends can leave the machine.
The agent reaches into namespaces with setns(2) on a short-lived thread (a
socket keeps the namespace it was created in), which is how it probes pods
(probes.py) and how CoreDNS, in the infra namespace, reaches the API server on
the host's loopback through a forwarder (see ApiForwarder).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


class NetError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def list_netns(prefix: str) -> list[str]:
    out = ip("netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def netns_pids(name: str) -> list[int]:
    out = ip("netns", "pids", name, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns_processes(name: str, sig: int = signal.SIGKILL, wait: float = 5.0) -> None:
    """Signal every process in the namespace (sshd's session children included)."""
    deadline = time.monotonic() + wait
    while True:
        pids = netns_pids(name)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def delete_netns(name: str) -> None:
    kill_netns_processes(name)
    ip("netns", "del", name, check=False)


def run_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Call fn on a fresh thread that first joined network namespace `name`.

    setns(2) with CLONE_NEWNET changes only the calling thread, and that thread
    ends right after, so the agent's other threads never change namespace.
    """
    result: dict[str, object] = {}

    def target() -> None:
        try:
            fd = os.open(NETNS_DIR / name, os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({name}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result["value"] = fn()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["value"]  # type: ignore[return-value]


class Network:
    """The bridge namespace and the pod namespaces of one agent."""

    def __init__(self, prefix: str, subnet: str):
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet)
        hosts = self.subnet.hosts()
        self.gateway = str(next(hosts))  # the bridge: CoreDNS listens here
        self._free = hosts
        self._released: list[str] = []
        self._lock = threading.Lock()
        self._next_link = 0
        self.infra = f"{prefix}-infra"

    def up(self) -> None:
        ip("netns", "add", self.infra)
        n = ["-n", self.infra]
        ip(*n, "link", "set", "lo", "up")
        ip(*n, "link", "add", "br0", "type", "bridge")
        ip(*n, "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", "br0")
        ip(*n, "link", "set", "br0", "up")

    def down(self) -> None:
        for name in list_netns(self.prefix):
            delete_netns(name)

    def add_pod(self) -> tuple[str, str]:
        """A new pod namespace wired to the bridge: (netns name, pod IP)."""
        with self._lock:
            self._next_link += 1
            link = self._next_link
            # A fresh address while the subnet has one; a released one, oldest first,
            # only after. A pod's address taken again at once is one a peer may still
            # reach through a stale neighbour entry, or that the old namespace still
            # holds while anything keeps it alive: twice CI's node-agent runs lost an
            # MPI connection between two new pods ("ORTE has lost communication"),
            # their launcher on 10.250.0.7, an address given out many times before.
            fresh = next(self._free, None)
            address = str(fresh) if fresh is not None else self._released.pop(0)
        netns = f"{self.prefix}-p{link}"
        veth = f"vp{link}"
        try:
            ip("netns", "add", netns)
            ip(
                "-n",
                self.infra,
                "link",
                "add",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                netns,
            )
            ip("-n", self.infra, "link", "set", veth, "master", "br0", "up")
            ip("-n", netns, "link", "set", "lo", "up")
            ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", netns, "link", "set", "eth0", "up")
        except NetError:
            self.remove_pod(netns, address)
            raise
        return netns, address

    def remove_pod(self, netns: str, address: str) -> None:
        delete_netns(netns)  # the veth pair goes with the namespace
        with self._lock:
            self._released.append(address)


class ApiForwarder:
    """Listens on 127.0.0.1:<port> inside a namespace and relays to 127.0.0.1:<port> here.

    CoreDNS runs in the infra namespace (where the pods can reach it) but its
    kubernetes plugin must watch the API server, which listens on the host's
    loopback only. The kubeconfig's server URL stays valid (same address and
    port, and the serving certificate names 127.0.0.1) inside the namespace.
    """

    def __init__(self, netns: str, port: int):
        self.netns, self.port = netns, port
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(64)
            return s

        self._listener = run_in_netns(self.netns, make)
        threading.Thread(target=self._accept, name="api-forwarder", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=_relay, args=(client, upstream), daemon=True).start()


def _relay(a: socket.socket, b: socket.socket) -> None:
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            src.shutdown(socket.SHUT_RD)


def sandbox_command(namespace: str, *argv: str) -> list[str]:
    """`argv` run in a pod's sandbox: its network namespace, plus a UTS namespace (its
    own hostname) and a private mount namespace (its own /etc files and volumes).
    The preflight check runs exactly this, so that it tests what pods will need."""
    return [
        "ip",
        "netns",
        "exec",
        namespace,
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "--",
        *argv,
    ]
