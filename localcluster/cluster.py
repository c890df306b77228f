"""A real Kubernetes control plane on 127.0.0.1, run as plain processes.

No Docker engine runs on our CI or dev machines and no images can be pulled, so
kind cannot run there. Instead this script builds kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm from the
Go module proxy (versions pinned in hack/versions.env) and runs them as local
processes. kwok registers fake GPU nodes and moves pods through their phases.

    hack/cluster.sh build      build (cached under ~/.cache/horovod-operator)
    hack/cluster.sh up         start etcd, apiserver, controller-manager, scheduler, kwok
    hack/cluster.sh status     which processes run, is the API server ready
    hack/cluster.sh down       stop exactly what `up` started, remove the data dir
    hack/cluster.sh env        print shell exports (KUBECONFIG, PATH)

Only the standard library is used: this runs before any virtualenv exists.
The CLI is localcluster/__main__.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .gobuild import bin_path, link_bins
from .paths import HACK, WORK
from .pki import make_pki, write_kubeconfig
from .poll import wait_for
from .processes import log_tail, port_free

DEFAULT_DIR = WORK / "cluster"
DEFAULT_PORT_BASE = 16400

# Annotations that the kwok stages in hack/kwok/stages.yaml read.
SIM_PHASE = "sim.horovod.ai/phase"
SIM_EXIT_CODE = "sim.horovod.ai/exit-code"
SIM_REASON = "sim.horovod.ai/reason"
SIM_MESSAGE = "sim.horovod.ai/message"
KWOK_NODE_LABEL = "horovod.ai/node-kind"
# Native gang scheduling (KEP-4671): scheduling.k8s.io/v1beta1 Workload and
# PodGroup, beta and off by default in 1.37. The operator detects the API; this
# cluster serves it so that the gang path is tested against the real scheduler.
# DRAWorkloadResourceClaims (beta, off by default in 1.37): a PodGroup's DRA claims
# shared by its pods (docs/dra.md). TopologyAwareWorkloadScheduling (alpha): a
# PodGroup placed in one topology domain (spec.scheduling.topology).
FEATURE_GATES = (
    "--feature-gates=GenericWorkload=true,DRAWorkloadResourceClaims=true,"
    "TopologyAwareWorkloadScheduling=true"
)


class ClusterError(RuntimeError):
    """A failure with a message that names the cause and the fix."""


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- layout


@dataclass
class Layout:
    """Where one cluster keeps its state, and which ports it uses."""

    root: Path = DEFAULT_DIR
    port_base: int = DEFAULT_PORT_BASE
    kwok_nodes: int = 4
    node_gpus: int = 8
    # Write the API server's audit log (logs/audit.log): the benchmark counts API
    # requests per verb and client from it. Off by default: it costs disk and CPU.
    audit: bool = False

    @property
    def ports(self) -> dict[str, int]:
        b = self.port_base
        return {
            "etcd-client": b,
            "etcd-peer": b + 1,
            "kube-apiserver": b + 43,
            "kube-controller-manager": b + 57,
            "kube-scheduler": b + 59,
            "kwok": b + 47,
        }

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "layout.json").write_text(
            json.dumps(
                {
                    "port_base": self.port_base,
                    "kwok_nodes": self.kwok_nodes,
                    "node_gpus": self.node_gpus,
                    "audit": self.audit,
                }
            )
        )

    @classmethod
    def load(cls, root: Path) -> Layout:
        data = json.loads((root / "layout.json").read_text())
        return cls(root=root, **data)


# ---------------------------------------------------------------- processes


@dataclass
class Component:
    name: str
    argv: list[str]
    ready: str  # how to tell it is ready: "apiserver", "etcd", "port", or "none"
    env: dict[str, str] = field(default_factory=dict)


def components(layout: Layout) -> list[Component]:
    p, pki, root = layout.ports, layout.pki, layout.root
    kcfg = {n: root / f"{n}.kubeconfig" for n in ("controller-manager", "scheduler")}
    return [
        Component(
            "etcd",
            [
                str(bin_path("etcd")),
                f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p['etcd-client']}",
                f"--advertise-client-urls=http://127.0.0.1:{p['etcd-client']}",
                f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-cluster=default=http://127.0.0.1:{p['etcd-peer']}",
                "--unsafe-no-fsync",  # test data only: fsync on every write makes tests crawl
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            "etcd",
        ),
        Component(
            "kube-apiserver",
            [
                str(bin_path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{p['etcd-client']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['kube-apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",  # in addition to the default set
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                # The endpoint reconciler refuses a loopback address; nothing here needs it.
                "--endpoint-reconciler-type=none",
                "--max-requests-inflight=800",
                "--max-mutating-requests-inflight=400",
                FEATURE_GATES,
                "--runtime-config=scheduling.k8s.io/v1beta1=true",
                *_audit_flags(layout),
                "--v=1",
            ],
            "apiserver",
        ),
        Component(
            "kube-controller-manager",
            [
                str(bin_path("kube-controller-manager")),
                f"--kubeconfig={kcfg['controller-manager']}",
                f"--authentication-kubeconfig={kcfg['controller-manager']}",
                f"--authorization-kubeconfig={kcfg['controller-manager']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-controller-manager']}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--controllers=*",
                # Fast GC and Job sync keep tests quick; the defaults are for big clusters.
                "--concurrent-gc-syncs=20",
                "--concurrent-job-syncs=20",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                FEATURE_GATES,
                "--v=1",
            ],
            "port",
        ),
        Component(
            "kube-scheduler",
            [
                str(bin_path("kube-scheduler")),
                f"--kubeconfig={kcfg['scheduler']}",
                f"--authentication-kubeconfig={kcfg['scheduler']}",
                f"--authorization-kubeconfig={kcfg['scheduler']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                "--leader-elect=false",
                FEATURE_GATES,
                "--v=1",
            ],
            "port",
        ),
        Component(
            "kwok",
            [
                str(bin_path("kwok")),
                f"--kubeconfig={layout.kubeconfig}",
                f"--config={HACK / 'kwok' / 'stages.yaml'}",
                f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}=kwok",
                f"--server-address=127.0.0.1:{p['kwok']}",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.255.0.1",
            ],
            "port",
        ),
    ]


def _audit_flags(layout: Layout) -> list[str]:
    """The benchmark counts API requests per verb from the audit log; off otherwise."""
    if not layout.audit:
        return []
    policy = layout.root / "audit-policy.yaml"
    policy.write_text(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
        "rules:\n- level: Metadata\n"
    )
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={layout.logs / 'audit.log'}",
        "--audit-log-maxsize=0",
        "--audit-log-mode=batch",
        "--audit-log-batch-max-wait=1s",
    ]


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int, binary: str) -> bool:
    """Alive and still the process we started (a recycled PID is not ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return cmdline == binary


def _reap(pid: int, binary: str, grace: float = 15) -> None:
    """Wait for a process we sent SIGTERM to end; SIGKILL it after `grace` seconds."""
    deadline = time.monotonic() + grace
    while _pid_alive(pid, binary) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid, binary):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _https_ok(url: str, timeout: float = 2.0) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Cluster:
    def __init__(self, layout: Layout):
        self.layout = layout

    # -- process bookkeeping
    def _pidfile(self, name: str) -> Path:
        return self.layout.pids / f"{name}.pid"

    def running(self) -> dict[str, int]:
        alive = {}
        for comp in self._known_components():
            pf = self._pidfile(comp.name)
            if pf.exists():
                pid = int(pf.read_text())
                if _pid_alive(pid, comp.argv[0]):
                    alive[comp.name] = pid
        return alive

    def _known_components(self) -> list[Component]:
        try:
            return components(self.layout)
        except (KeyError, FileNotFoundError):
            return []

    def _start(self, comp: Component) -> subprocess.Popen[bytes]:
        log_path = self.layout.logs / f"{comp.name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                comp.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **comp.env},
            )
        self._pidfile(comp.name).write_text(str(proc.pid))
        return proc

    def _wait_ready(
        self, comp: Component, proc: subprocess.Popen[bytes], timeout: float = 90
    ) -> None:
        ports = self.layout.ports
        log_file = self.layout.logs / f"{comp.name}.log"

        def ready() -> bool:
            # poll(), not /proc: right after fork the child may not have exec'd yet.
            if proc.poll() is not None:
                raise ClusterError(
                    f"{comp.name} exited during start-up. Last lines of {log_file}:\n"
                    f"{log_tail(log_file, 40)}"
                )
            if comp.ready == "etcd":
                return _http_ok(f"http://127.0.0.1:{ports['etcd-client']}/health")
            if comp.ready == "apiserver":
                return _https_ok(f"{self.layout.server}/readyz")
            return _port_open(ports[comp.name])

        wait_for(
            ready,
            timeout,
            message=f"{comp.name} to become ready",
            describe=lambda: f"Last lines of {log_file}:\n{log_tail(log_file, 40)}",
            error=ClusterError,
        )

    # -- lifecycle
    def up(self) -> None:
        layout = self.layout
        if self.running():
            raise ClusterError(
                f"a cluster already runs from {layout.root} ({', '.join(self.running())}). "
                "Fix: `hack/cluster.sh down` first, or use it as it is."
            )
        for name, port in layout.ports.items():
            if not port_free(port):
                raise ClusterError(
                    f"port {port} (for {name}) on 127.0.0.1 is already in use. Fix: stop what "
                    f"listens there (`ss -ltnp 'sport = :{port}'`) or choose other ports with "
                    "--port-base / HVK_PORT_BASE."
                )
        missing = [
            str(bin_path(n))
            for n in (
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
                "kubectl",
            )
            if not bin_path(n).exists()
        ]
        if missing:
            raise ClusterError(
                f"binaries are not built: {', '.join(missing)}. Fix: hack/cluster.sh build"
            )
        if layout.root.exists():
            shutil.rmtree(layout.root)
        for d in (layout.logs, layout.pids):
            d.mkdir(parents=True, exist_ok=True)
        layout.save()
        link_bins(layout.bin)
        started = time.monotonic()
        try:
            make_pki(layout.pki)
            write_kubeconfig(layout.kubeconfig, layout.server, layout.pki, "admin")
            for user in ("controller-manager", "scheduler"):
                write_kubeconfig(
                    layout.root / f"{user}.kubeconfig", layout.server, layout.pki, user
                )
            for comp in components(layout):
                proc = self._start(comp)
                self._wait_ready(comp, proc)
                pid = proc.pid
                log(f"{comp.name} ready (pid {pid})")
                if comp.name == "kube-apiserver":
                    self._wait_default_objects()
            self.add_kwok_nodes(layout.kwok_nodes, layout.node_gpus)
            self.wait_nodes_ready()
        except BaseException:
            log("start-up failed; stopping what was started")
            self.down(quiet=True)
            raise
        log(
            f"cluster up in {time.monotonic() - started:.1f}s; "
            f"export KUBECONFIG={layout.kubeconfig}"
        )

    def _wait_default_objects(self, timeout: float = 60) -> None:
        """RBAC bootstrap policy must exist before the controllers authenticate."""
        wait_for(
            lambda: (
                self.kubectl(
                    "get", "clusterrolebinding", "system:kube-controller-manager", check=False
                ).returncode
                == 0
            ),
            timeout,
            interval=0.3,
            message="the API server's bootstrap RBAC policy",
            error=ClusterError,
        )

    def down(self, quiet: bool = False) -> None:
        comps = {c.name: c for c in self._known_components()}
        running = list(self.running().items())
        for _, pid in reversed(running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for name, pid in reversed(running):
            _reap(pid, comps[name].argv[0])
            if not quiet:
                log(f"stopped {name} (pid {pid})")
        if self.layout.root.exists():
            shutil.rmtree(self.layout.root, ignore_errors=True)
            if not quiet:
                log(f"removed {self.layout.root}")

    def restart(self, name: str) -> None:
        """Stop one component (SIGTERM) and start it again on the same state: what an
        upgrade or a crash-looping control plane does to the operators using it."""
        comp = next(c for c in self._known_components() if c.name == name)
        pid = self.running().get(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _reap(pid, comp.argv[0])
        proc = self._start(comp)
        self._wait_ready(comp, proc)
        log(f"{name} restarted (pid {proc.pid})")

    def status(self) -> dict[str, object]:
        alive = self.running()
        return {
            "dir": str(self.layout.root),
            "kubeconfig": str(self.layout.kubeconfig),
            "processes": {c.name: alive.get(c.name) for c in self._known_components()},
            "apiserver_ready": bool(alive) and _https_ok(f"{self.layout.server}/readyz"),
        }

    # -- kubectl helpers
    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(bin_path("kubectl")), f"--kubeconfig={self.layout.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def add_kwok_nodes(
        self, count: int, gpus: int, prefix: str = "kwok-gpu-", start: int = 0
    ) -> list[str]:
        names = [f"{prefix}{i}" for i in range(start, start + count)]
        docs = [kwok_node(n, gpus) for n in names]
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
        return names

    def wait_nodes_ready(self, timeout: float = 60) -> None:
        def all_ready() -> bool:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            return bool(nodes) and all(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
                for n in nodes
            )

        wait_for(
            all_ready,
            timeout,
            interval=0.3,
            message="every kwok node Ready",
            describe=lambda: f"kwok log:\n{log_tail(self.layout.logs / 'kwok.log', 40)}",
            error=ClusterError,
        )

    def set_pod_phase(
        self,
        namespace: str,
        pod: str,
        phase: str,
        exit_code: int = 0,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """Ask kwok to move a pod to Succeeded or Failed (see hack/kwok/stages.yaml)."""
        if phase not in ("Succeeded", "Failed"):
            raise ValueError(f"phase must be Succeeded or Failed, not {phase!r}")
        ann = [f"{SIM_PHASE}={phase}", f"{SIM_EXIT_CODE}={exit_code}"]
        if reason:
            ann.append(f"{SIM_REASON}={reason}")
        if message:
            ann.append(f"{SIM_MESSAGE}={message}")
        self.kubectl("annotate", "--overwrite", "-n", namespace, f"pod/{pod}", *ann)


def kwok_node(name: str, gpus: int) -> dict[str, object]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "1000", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                KWOK_NODE_LABEL: "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }
