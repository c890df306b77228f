#!/usr/bin/env python3
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
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
CACHE = Path(os.environ.get("HOROVOD_OPERATOR_CACHE", Path.home() / ".cache" / "horovod-operator"))
DEFAULT_DIR = REPO / ".work" / "cluster"
DEFAULT_PORT_BASE = 16400

# Annotations that the kwok stages in hack/kwok/stages.yaml read.
SIM_PHASE = "sim.horovod.ai/phase"
SIM_EXIT_CODE = "sim.horovod.ai/exit-code"
SIM_REASON = "sim.horovod.ai/reason"
SIM_MESSAGE = "sim.horovod.ai/message"
KWOK_NODE_LABEL = "horovod.ai/node-kind"


class ClusterError(RuntimeError):
    """A failure with a message that names the cause and the fix."""


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- versions


def read_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    for line in (HACK / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


@dataclass(frozen=True)
class Tool:
    """One go.mod under hack/tools and the binaries built from it (name -> package)."""

    name: str
    version_key: str
    binaries: dict[str, str]
    # Go packages whose version variables are stamped at link time, as the upstream
    # release build does; without them kubectl refuses the "v0.0.0-master" it would report.
    version_packages: tuple[str, ...] = ()

    # Packages whose k8sVersionMajor/Minor say which Kubernetes `helm template` and
    # `helm lint` assume without a cluster (helm's Makefile sets them from its client-go).
    kube_version_packages: tuple[str, ...] = ()
    # Variables that hold the plain version string (helm's own `helm version`).
    version_vars: tuple[str, ...] = ()

    def ldflags(self, version: str) -> str:
        flags = ["-s", "-w", *(f"-X {var}={version}" for var in self.version_vars)]
        major, minor = version.lstrip("v").split(".")[:2]
        if self.kube_version_packages:
            kube_minor = _module_version(self.go_dir() / "go.mod", "k8s.io/client-go").split(".")[1]
            for pkg in self.kube_version_packages:
                flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={kube_minor}"]
        for pkg in self.version_packages:
            flags += [
                f"-X {pkg}.{k}={v}"
                for k, v in (
                    ("gitVersion", version),
                    ("gitMajor", major),
                    ("gitMinor", minor),
                    ("gitTreeState", "clean"),
                    ("buildDate", "1970-01-01T00:00:00Z"),
                )
            ]
        return " ".join(flags)

    def go_dir(self) -> Path:
        return HACK / "tools" / self.name

    def bin_dir(self, versions: dict[str, str]) -> Path:
        return CACHE / "bin" / f"{self.name}-{versions[self.version_key]}"


TOOLS = (
    Tool(
        "kubernetes",
        "KUBERNETES_VERSION",
        {
            name: f"k8s.io/kubernetes/cmd/{name}"
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        },
        ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"),
    ),
    # etcd's server module root is the etcd main package.
    Tool("etcd", "ETCD_VERSION", {"etcd": "go.etcd.io/etcd/server/v3"}),
    Tool("kwok", "KWOK_VERSION", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
    Tool(
        "helm",
        "HELM_VERSION",
        {"helm": "helm.sh/helm/v3/cmd/helm"},
        kube_version_packages=("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"),
        version_vars=("helm.sh/helm/v3/internal/version.version",),
    ),
)


def _module_version(gomod: Path, module: str) -> str:
    for line in gomod.read_text().splitlines():
        parts = line.replace("require ", "").split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise ClusterError(f"{gomod} does not require {module}")


def bin_path(name: str, versions: dict[str, str] | None = None) -> Path:
    versions = versions or read_versions()
    for tool in TOOLS:
        if name in tool.binaries:
            return tool.bin_dir(versions) / name
    raise KeyError(name)


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(Path.home() / ".cache" / "go-mod"))
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    # -mod=mod lets go.sum be completed on a machine whose module cache is empty.
    env["GOFLAGS"] = "-mod=mod -trimpath -buildvcs=false"
    return env


def _stamp(tool: Tool) -> str:
    digest = hashlib.sha256(tool.ldflags(read_versions()[tool.version_key]).encode())
    for name in ("go.mod", "go.sum"):
        path = tool.go_dir() / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def build(tools: Sequence[str] = ()) -> None:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "`go` is not on PATH. Install Go 1.26 or newer (https://go.dev/doc/install) "
            "and run `hack/cluster.sh build` again."
        )
    versions = read_versions()
    wanted = [t for t in TOOLS if not tools or t.name in tools]
    for tool in wanted:
        out = tool.bin_dir(versions)
        stamp_file = out / ".stamp"
        cached = stamp_file.exists() and stamp_file.read_text() == _stamp(tool)
        if cached and all((out / b).exists() for b in tool.binaries):
            log(f"{tool.name} {versions[tool.version_key]}: cached in {out}")
            continue
        out.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        ldflags = tool.ldflags(versions[tool.version_key])
        for name, package in tool.binaries.items():
            log(f"{tool.name} {versions[tool.version_key]}: building {package}")
            proc = subprocess.run(
                [go, "build", f"-ldflags={ldflags}", "-o", str(out / name), package],
                cwd=tool.go_dir(),
                env=go_env(),
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            if proc.returncode != 0:
                raise ClusterError(
                    f"building {package} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n"
                    "Fix: check that the Go module proxy is reachable and that `go version` is at "
                    f"least the `go` line of {tool.go_dir() / 'go.mod'}."
                )
        stamp_file.write_text(_stamp(tool))
        log(f"{tool.name}: built in {time.monotonic() - start:.0f}s")


def link_bins(target: Path) -> None:
    """Symlink every built binary into `target` (for PATH)."""
    versions = read_versions()
    target.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        for name in tool.binaries:
            link = target / name
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to(tool.bin_dir(versions) / name)


# ---------------------------------------------------------------- layout


@dataclass
class Layout:
    """Where one cluster keeps its state, and which ports it uses."""

    root: Path = DEFAULT_DIR
    port_base: int = DEFAULT_PORT_BASE
    kwok_nodes: int = 4
    node_gpus: int = 8

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
                }
            )
        )

    @classmethod
    def load(cls, root: Path) -> Layout:
        data = json.loads((root / "layout.json").read_text())
        return cls(root=root, **data)


# ---------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def make_pki(pki: Path) -> None:
    if shutil.which("openssl") is None:
        raise ClusterError("`openssl` is not installed. Fix: apt-get install -y openssl")
    pki.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=horovod-operator-local-ca",
        cwd=pki,
    )
    sans = (
        "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    )
    certs = {
        "apiserver": ("/CN=kube-apiserver", sans),
        "admin": ("/O=system:masters/CN=kubernetes-admin", None),
        "controller-manager": ("/CN=system:kube-controller-manager", None),
        "scheduler": ("/CN=system:kube-scheduler", None),
    }
    for name, (subj, ext) in certs.items():
        extra = ["-addext", ext] if ext else []
        _openssl(
            "req",
            "-x509",
            *ec,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
            "-days",
            "3650",
            "-subj",
            subj,
            *extra,
            cwd=pki,
        )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with embedded file paths (kubectl and the Python client both read it)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: local\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {pki / 'ca.crt'}\n"
        f"users:\n- name: {user}\n  user:\n"
        f"    client-certificate: {pki / (user + '.crt')}\n"
        f"    client-key: {pki / (user + '.key')}\n"
        f"contexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\n"
        "current-context: local\n"
    )


# ---------------------------------------------------------------- processes


@dataclass
class Component:
    name: str
    argv: list[str]
    ready: str  # how to tell it is ready: "apiserver", "etcd", "port", or "none"
    env: dict[str, str] = field(default_factory=dict)


def components(layout: Layout) -> list[Component]:
    versions = read_versions()
    p, pki, root = layout.ports, layout.pki, layout.root
    kcfg = {n: root / f"{n}.kubeconfig" for n in ("controller-manager", "scheduler")}
    return [
        Component(
            "etcd",
            [
                str(bin_path("etcd", versions)),
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
                str(bin_path("kube-apiserver", versions)),
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
                *_audit_flags(layout),
                "--v=1",
            ],
            "apiserver",
        ),
        Component(
            "kube-controller-manager",
            [
                str(bin_path("kube-controller-manager", versions)),
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
                "--v=1",
            ],
            "port",
        ),
        Component(
            "kube-scheduler",
            [
                str(bin_path("kube-scheduler", versions)),
                f"--kubeconfig={kcfg['scheduler']}",
                f"--authentication-kubeconfig={kcfg['scheduler']}",
                f"--authorization-kubeconfig={kcfg['scheduler']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                "--leader-elect=false",
                "--v=1",
            ],
            "port",
        ),
        Component(
            "kwok",
            [
                str(bin_path("kwok", versions)),
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
    if os.environ.get("HVK_AUDIT") != "1":
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


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


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
        deadline = time.monotonic() + timeout
        ports = self.layout.ports
        while time.monotonic() < deadline:
            # poll(), not /proc: right after fork the child may not have exec'd yet.
            if proc.poll() is not None:
                log_file = self.layout.logs / f"{comp.name}.log"
                raise ClusterError(
                    f"{comp.name} exited during start-up. Last lines of {log_file}:\n"
                    f"{_tail(log_file)}"
                )
            if comp.ready == "etcd":
                ok = _http_ok(f"http://127.0.0.1:{ports['etcd-client']}/health")
            elif comp.ready == "apiserver":
                ok = _https_ok(f"{self.layout.server}/readyz")
            else:
                ok = _port_open(ports[comp.name])
            if ok:
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{comp.name} did not become ready in {timeout:.0f}s. Last log lines:\n"
            f"{_tail(self.layout.logs / (comp.name + '.log'))}"
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
            if not _port_free(port):
                raise ClusterError(
                    f"port {port} (for {name}) on 127.0.0.1 is already in use. Fix: stop what "
                    f"listens there (`ss -ltnp 'sport = :{port}'`) or choose other ports with "
                    "--port-base / HVK_PORT_BASE."
                )
        versions = read_versions()
        missing = [
            str(bin_path(n, versions))
            for n in (
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
                "kubectl",
            )
            if not bin_path(n, versions).exists()
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.kubectl(
                "get", "clusterrolebinding", "system:kube-controller-manager", check=False
            )
            if proc.returncode == 0:
                return
            time.sleep(0.3)
        raise ClusterError("the API server never created its bootstrap RBAC policy")

    def down(self, quiet: bool = False) -> None:
        stopped = []
        for name, pid in reversed(list(self.running().items())):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            stopped.append((name, pid))
        deadline = time.monotonic() + 15
        comps = {c.name: c for c in self._known_components()}
        for name, pid in stopped:
            while _pid_alive(pid, comps[name].argv[0]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _pid_alive(pid, comps[name].argv[0]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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
            deadline = time.monotonic() + 15
            while _pid_alive(pid, comp.argv[0]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _pid_alive(pid, comp.argv[0]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.kubectl("get", "nodes", "-o", "json").stdout
            nodes = json.loads(out)["items"]
            ready = [
                n
                for n in nodes
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            ]
            if nodes and len(ready) == len(nodes):
                return
            time.sleep(0.3)
        raise ClusterError(
            f"kwok nodes did not become Ready. kwok log:\n{_tail(self.layout.logs / 'kwok.log')}"
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


# ---------------------------------------------------------------- CLI


def _layout_from_args(args: argparse.Namespace) -> Layout:
    root = Path(args.dir).resolve()
    if (root / "layout.json").exists() and args.command != "up":
        return Layout.load(root)
    return Layout(root=root, port_base=args.port_base, kwok_nodes=args.nodes, node_gpus=args.gpus)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="hack/cluster.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", choices=["build", "up", "down", "status", "env", "set-pod-phase"]
    )
    parser.add_argument(
        "args", nargs="*", help="set-pod-phase: NAMESPACE POD PHASE [EXIT_CODE [REASON]]"
    )
    parser.add_argument(
        "--dir",
        default=os.environ.get("HVK_DIR", str(DEFAULT_DIR)),
        help="state directory (kubeconfig, logs, pids) [%(default)s]",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=int(os.environ.get("HVK_PORT_BASE", DEFAULT_PORT_BASE)),
        help="first of the 127.0.0.1 ports the cluster uses [%(default)s]",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("HVK_KWOK_NODES", 4)),
        help="kwok GPU nodes to register [%(default)s]",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=int(os.environ.get("HVK_NODE_GPUS", 8)),
        help="nvidia.com/gpu capacity of each kwok node [%(default)s]",
    )
    args = parser.parse_args(argv)
    with _errors():
        if args.command == "build":
            build(args.args)
            return
        cluster = Cluster(_layout_from_args(args))
        if args.command == "up":
            build()
            cluster.up()
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            st = cluster.status()
            print(json.dumps(st, indent=2))
            sys.exit(0 if st["apiserver_ready"] else 1)
        elif args.command == "env":
            print(f"export KUBECONFIG={cluster.layout.kubeconfig}")
            print(f"export PATH={cluster.layout.bin}:$PATH")
        elif args.command == "set-pod-phase":
            ns, pod, phase, *rest = args.args
            cluster.set_pod_phase(
                ns, pod, phase, int(rest[0]) if rest else 0, rest[1] if len(rest) > 1 else None
            )


if __name__ == "__main__":
    main()
