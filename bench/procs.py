"""The operators under test as processes: build, start, stop, and sample their CPU and memory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MPI_TOOL_DIR = REPO / "bench" / "tools" / "mpi-operator"
MPI_PACKAGE = "github.com/kubeflow/mpi-operator/cmd/mpi-operator"
MPI_MODULE = "github.com/kubeflow/mpi-operator"
CACHE = Path(os.environ.get("HOROVOD_OPERATOR_CACHE", Path.home() / ".cache" / "horovod-operator"))
HEAVY_LOCK = "/tmp/heavy-build.lock"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# mpi-operator serves /healthz on this fixed port (cmd/mpi-operator/app/server.go).
MPI_HEALTH_PORT = 8080


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- mpi-operator build ---------------------------------------------------------------------


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(Path.home() / ".cache" / "go-mod"))
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    env["GOFLAGS"] = "-mod=mod -trimpath -buildvcs=false"
    return env


def mpi_version() -> str:
    """The mpi-operator version pinned in bench/tools/mpi-operator/go.mod."""
    for line in (MPI_TOOL_DIR / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == MPI_MODULE:
            return parts[1]
        if len(parts) >= 3 and parts[0] == "require" and parts[1] == MPI_MODULE:
            return parts[2]
    raise RuntimeError(f"{MPI_MODULE} is not required in {MPI_TOOL_DIR / 'go.mod'}")


def mpi_binary() -> Path:
    return CACHE / "bin" / f"mpi-operator-{mpi_version()}" / "mpi-operator"


def mpi_module_dir() -> Path:
    return Path(go_env()["GOMODCACHE"]) / f"{MPI_MODULE}@{mpi_version()}"


def mpi_crd() -> Path:
    return mpi_module_dir() / "manifests" / "base" / "kubeflow.org_mpijobs.yaml"


def build_mpi_operator() -> Path:
    """go build mpi-operator from the module proxy (cached; heavy, so under the machine lock)."""
    out = mpi_binary()
    if out.exists() and mpi_crd().exists():
        return out
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("`go` is not on PATH; install Go to build mpi-operator")
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"building {MPI_PACKAGE}@{mpi_version()} (a few minutes on 2 cores)")
    cmd = [go, "build", "-ldflags=-s -w", "-o", str(out), MPI_PACKAGE]
    if shutil.which("flock"):
        cmd = ["flock", HEAVY_LOCK, *cmd]
    proc = subprocess.run(
        cmd, cwd=MPI_TOOL_DIR, env=go_env(), text=True, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building mpi-operator failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return out


# --- process sampling ----------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return resident * PAGE / 2**20


class Sampler:
    """Samples a process's RSS in a thread; CPU seconds between start() and stop()."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0.0
        self.cpu = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu0 = 0.0
        self._t0 = 0.0
        self.wall = 0.0

    def start(self) -> Sampler:
        self._cpu0 = cpu_seconds(self.pid)
        self._t0 = time.monotonic()
        self.peak_rss = rss_mb(self.pid)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak_rss = max(self.peak_rss, rss_mb(self.pid))
            except (FileNotFoundError, ProcessLookupError):
                return

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cpu = cpu_seconds(self.pid) - self._cpu0
        self.wall = time.monotonic() - self._t0
        return {
            "cpu_seconds": round(self.cpu, 2),
            "wall_seconds": round(self.wall, 2),
            "rss_peak_mb": round(self.peak_rss, 1),
            "rss_end_mb": round(rss_mb(self.pid), 1),
        }


# --- the operators -------------------------------------------------------------------------


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class OperatorSpec:
    """One operator configuration under test."""

    key: str  # "ours", "mpi", "mpi-defaults"
    label: str
    kind: str  # "horovod" or "mpi"
    qps: float
    burst: int
    extra: list[str] = field(default_factory=list)

    @property
    def user_agents(self) -> tuple[str, ...]:
        # Ours: the reconciler's client and kopf's watches; theirs: client-go's default.
        return ("horovod-operator", "kopf/") if self.kind == "horovod" else ("mpi-operator/",)


class OperatorProcess:
    def __init__(
        self, spec: OperatorSpec, kubeconfig: Path, namespaces: list[str], log_path: Path
    ) -> None:
        self.spec = spec
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        spec = self.spec
        if spec.kind == "horovod":
            self.port = free_port()
            ns_args = [a for ns in self.namespaces for a in ("--namespace", ns)]
            return [
                sys.executable,
                "-m",
                "horovod_operator",
                *ns_args,
                "--kubeconfig",
                str(self.kubeconfig),
                "--http-port",
                str(self.port),
                "--qps",
                str(spec.qps),
                "--burst",
                str(spec.burst),
                *spec.extra,
            ]
        if len(self.namespaces) != 1:
            raise ValueError("mpi-operator watches one namespace (or all)")
        self.port = MPI_HEALTH_PORT
        return [
            str(mpi_binary()),
            f"--kubeConfig={self.kubeconfig}",
            f"--namespace={self.namespaces[0]}",
            # The lease lives beside the jobs, so a fresh instance never waits out an old lease.
            f"--lock-namespace={self.namespaces[0]}",
            f"--kube-api-qps={int(spec.qps)}",
            f"--kube-api-burst={spec.burst}",
            "--monitoring-port=0",
            *spec.extra,
        ]

    def start(self, timeout: float = 90) -> float:
        """Start and wait until it works; returns the seconds that took."""
        argv = self.argv()
        if self.spec.kind == "mpi" and not port_free(MPI_HEALTH_PORT):
            raise RuntimeError(
                f"port {MPI_HEALTH_PORT} is taken; mpi-operator serves /healthz there (fixed)"
            )
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONUNBUFFERED="1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.spec.label} exited ({self.proc.returncode}) at start:\n{self.tail()}"
                )
            if self._ready():
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{self.spec.label} not ready after {timeout}s:\n{self.tail()}")

    def _ready(self) -> bool:
        if self.spec.kind == "mpi":
            # Informers synced and workers started (after it won the lease).
            return "Started workers" in self.log_path.read_text(errors="replace")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
