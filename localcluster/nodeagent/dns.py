"""Cluster DNS for the pods: CoreDNS with its kubernetes plugin, in the bridge namespace.

CoreDNS is built from its Go module (hack/tools/coredns: a main package that
links only the plugins used below) and runs inside the agent's infra network
namespace on <bridge address>:53, where every pod reaches it. Its kubernetes
plugin watches Services and EndpointSlices through ApiForwarder, so
`<hostname>.<subdomain>.<ns>.svc.cluster.local` (from the headless Service's
EndpointSlice) and `<service>.<ns>.svc.cluster.local` resolve exactly as they
do in a real cluster. Names outside cluster.local get NXDOMAIN: nothing is
forwarded off the machine.
"""

from __future__ import annotations

import random
import socket
import struct
import subprocess
import time
from pathlib import Path

from .. import gobuild
from . import netns


class DnsError(RuntimeError):
    pass


def build() -> Path:
    """CoreDNS, built once from hack/tools/coredns (cached in ~/.cache/horovod-operator/bin)."""
    try:
        return gobuild.ensure("coredns")
    except gobuild.BuildError as exc:
        raise DnsError(f"{exc}\nThen start the agent again.") from None


def corefile(kubeconfig: Path) -> str:
    return f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} local
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


class CoreDNS:
    def __init__(self, infra_netns: str, address: str, kubeconfig: Path, state: Path):
        self.netns, self.address = infra_netns, address
        self.kubeconfig, self.state = kubeconfig, state
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, binary: Path, timeout: float = 60) -> int:
        self.state.mkdir(parents=True, exist_ok=True)
        conf = self.state / "Corefile"
        conf.write_text(corefile(self.kubeconfig))
        with open(self.state / "coredns.log", "ab") as out:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, str(binary), "-conf", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DnsError(
                    f"CoreDNS exited ({self.proc.returncode}); see {self.state / 'coredns.log'}"
                )
            if query(self.netns, self.address, "kubernetes.default.svc.cluster.local"):
                return self.proc.pid
            time.sleep(0.3)
        raise DnsError(
            f"CoreDNS did not answer for kubernetes.default.svc.cluster.local in {timeout:.0f}s; "
            f"see {self.state / 'coredns.log'}"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def query(ns: str, server: str, name: str, timeout: float = 1.0) -> list[str]:
    """The A records of `name` asked of `server` from inside namespace `ns` (a tiny resolver)."""
    qid = random.randrange(65536)
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    packet += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    packet += struct.pack(">HH", 1, 1)
    sock = netns.run_in_netns(ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(packet, (server, 53))
            data = sock.recv(4096)
        except OSError:
            return []
    rid, flags, qd, an = struct.unpack(">HHHH", data[:8])
    if rid != qid or flags & 0xF:
        return []
    pos = 12
    for _ in range(qd):
        pos = _skip_name(data, pos) + 4
    out = []
    for _ in range(an):
        pos = _skip_name(data, pos)
        rtype, _cls, _ttl, length = struct.unpack(">HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1 and length == 4:
            out.append(socket.inet_ntoa(data[pos : pos + 4]))
        pos += length
    return out


def _skip_name(data: bytes, pos: int) -> int:
    while True:
        length = data[pos]
        if length == 0:
            return pos + 1
        if length & 0xC0 == 0xC0:
            return pos + 2
        pos += length + 1
