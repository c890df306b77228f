"""Cluster DNS for the pods: CoreDNS with its kubernetes plugin, in the bridge namespace.

CoreDNS is built from its Go module (hack/nodeagent/coredns: a main package that
links only the plugins used below) and runs inside the agent's infra network
namespace on <bridge address>:53, where every pod reaches it. Its kubernetes
plugin watches Services and EndpointSlices through ApiForwarder, so
`<hostname>.<subdomain>.<ns>.svc.cluster.local` (from the headless Service's
EndpointSlice) and `<service>.<ns>.svc.cluster.local` resolve exactly as they
do in a real cluster. Names outside cluster.local get NXDOMAIN: nothing is
forwarded off the machine.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

from . import netns

HERE = Path(__file__).resolve().parent
GO_DIR = HERE / "coredns"
CACHE = Path(os.environ.get("HOROVOD_OPERATOR_CACHE", Path.home() / ".cache" / "horovod-operator"))


class DnsError(RuntimeError):
    pass


def coredns_version() -> str:
    match = re.search(r"github\.com/coredns/coredns (v\S+)", (GO_DIR / "go.mod").read_text())
    assert match, "hack/nodeagent/coredns/go.mod must require github.com/coredns/coredns"
    return match.group(1)


def coredns_binary() -> Path:
    return CACHE / "bin" / f"coredns-{coredns_version()}" / "coredns"


def build() -> Path:
    """Build CoreDNS once (cached in ~/.cache/horovod-operator/bin)."""
    binary = coredns_binary()
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise DnsError(
            "CoreDNS is not built and `go` is not on PATH. Fix: install Go 1.26+ "
            "(https://go.dev/doc/install), or run hack/bootstrap.sh, then start the agent again."
        )
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": "-mod=mod -trimpath -buildvcs=false"}
    env.setdefault("GOMODCACHE", str(Path.home() / ".cache" / "go-mod"))
    print(f"[nodeagent] building CoreDNS {coredns_version()} (once; a few minutes)", flush=True)
    proc = subprocess.run(
        [go, "build", "-ldflags=-s -w", "-o", str(binary) + ".tmp", "."],
        cwd=GO_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise DnsError(
            f"building CoreDNS failed:\n{proc.stderr[-3000:]}\n"
            "Fix: check that the Go module proxy is reachable, then start the agent again."
        )
    Path(str(binary) + ".tmp").replace(binary)
    return binary


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
