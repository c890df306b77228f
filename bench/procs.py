"""The operators under test as processes: build, start, stop, and sample their CPU and memory."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import gobuild, operator, operator_venv
from localcluster.processes import port_free

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# mpi-operator serves /healthz on this fixed port (cmd/mpi-operator/app/server.go).
MPI_HEALTH_PORT = 8080


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- mpi-operator build ---------------------------------------------------------------------


MPI_TOOL = gobuild.tool("mpi-operator")


def mpi_version() -> str:
    """The mpi-operator version pinned in hack/tools/mpi-operator/go.mod."""
    return MPI_TOOL.version()


def mpi_binary() -> Path:
    return gobuild.bin_path("mpi-operator")


def mpi_crd() -> Path:
    return (
        gobuild.module_dir(MPI_TOOL.module, mpi_version())
        / "manifests/base/kubeflow.org_mpijobs.yaml"
    )


def build_mpi_operator() -> Path:
    """go build mpi-operator from the module proxy (cached; under the machine's build lock)."""
    return gobuild.ensure("mpi-operator")


# --- process sampling ----------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return resident * PAGE / 2**20


class Sampler:
    """Samples the RSS of some processes in a thread; CPU seconds between start() and
    stop(). Several processes (Trainer v2's two managers) count as their sum."""

    def __init__(self, pid: int | Sequence[int], interval: float = 0.25) -> None:
        self.pids = [pid] if isinstance(pid, int) else list(pid)
        self.interval = interval
        self.peak_rss = 0.0
        self.cpu = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu0 = 0.0
        self._t0 = 0.0
        self.wall = 0.0

    def _cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def _rss(self) -> float:
        return sum(rss_mb(pid) for pid in self.pids)

    def start(self) -> Sampler:
        self._cpu0 = self._cpu()
        self._t0 = time.monotonic()
        self.peak_rss = self._rss()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak_rss = max(self.peak_rss, self._rss())
            except (FileNotFoundError, ProcessLookupError):
                return

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cpu = self._cpu() - self._cpu0
        self.wall = time.monotonic() - self._t0
        return {
            "cpu_seconds": round(self.cpu, 2),
            "wall_seconds": round(self.wall, 2),
            "rss_peak_mb": round(self.peak_rss, 1),
            "rss_end_mb": round(self._rss(), 1),
        }


# --- the operators -------------------------------------------------------------------------


@dataclass
class OperatorSpec:
    """One operator configuration under test."""

    key: str  # "ours", "mpi", "mpi-defaults"
    label: str
    kind: str  # "horovod", "mpi", "trainer" (Kubeflow Trainer v2) or "baseline" (bench.baseline)
    qps: float
    burst: int
    extra: list[str] = field(default_factory=list)
    # Ours: the jobs' spec.scheduling.gang.policy (None: the default, Auto); mpi-operator's:
    # the scheduler its --gang-scheduling names (None: none), for its jobs' schedulingPolicy.
    gang: str | None = None

    @property
    def user_agents(self) -> tuple[str, ...]:
        # Ours: the reconciler's client and kopf's watches; theirs: client-go's default.
        if self.kind == "mpi":
            return ("mpi-operator/",)
        if self.kind == "trainer":  # Trainer: client-go's default (the binary); JobSet: its own
            return ("trainer-controller-manager/", "jobset/")
        return ("horovod-operator", "kopf/") if self.kind == "horovod" else ("horovod-operator",)


class MpiOperatorProcess(operator.OperatorProcess):
    """kubeflow/mpi-operator as released, with the same start/stop/tail surface."""

    def __init__(self, spec: OperatorSpec, kubeconfig: Path, namespace: str, log_path: Path):
        super().__init__(kubeconfig, [namespace], log_path)
        self.spec = spec
        self.port = MPI_HEALTH_PORT
        self.label = spec.label

    def argv(self) -> list[str]:
        namespace = self.namespaces[0]
        return [
            str(mpi_binary()),
            f"--kubeConfig={self.kubeconfig}",
            f"--namespace={namespace}",
            # The lease lives beside the jobs, so a fresh instance never waits out an old lease.
            f"--lock-namespace={namespace}",
            f"--kube-api-qps={int(self.spec.qps)}",
            f"--kube-api-burst={self.spec.burst}",
            "--monitoring-port=0",
            *self.spec.extra,
        ]

    def start(self) -> None:
        if not port_free(MPI_HEALTH_PORT, "0.0.0.0"):
            raise RuntimeError(
                f"port {MPI_HEALTH_PORT} is taken; mpi-operator serves /healthz there (fixed)"
            )
        super().start()

    def ready(self) -> bool:
        # Informers synced and workers started (after it won the lease).
        return "Started workers" in self.tail(10_000)


class BaselineProcess(operator.OperatorProcess):
    """bench.baseline: the minimal client that creates a job's objects at once."""

    def __init__(self, spec: OperatorSpec, kubeconfig: Path, namespace: str, log_path: Path):
        super().__init__(kubeconfig, [namespace], log_path)
        self.spec = spec
        self.label = spec.label

    def argv(self) -> list[str]:
        return [
            self.python, "-m", "bench.baseline",
            "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespaces[0],
            "--qps", str(self.spec.qps), "--burst", str(self.spec.burst), *self.spec.extra,
        ]  # fmt: skip

    def ready(self) -> bool:
        return "baseline client ready" in self.tail(10_000)


def operator_process(
    spec: OperatorSpec, kubeconfig: Path, namespaces: list[str], log_path: Path
) -> operator.OperatorProcess:
    """The process for one configuration under test: ours, mpi-operator, or the baseline."""
    if spec.kind == "baseline":
        return BaselineProcess(spec, kubeconfig, namespaces[0], log_path)
    if spec.kind == "horovod":
        extra = ["--qps", str(spec.qps), "--burst", str(spec.burst), *spec.extra]
        # As it ships: without the SDK's kubernetes package (localcluster/operator_venv.py).
        python = operator_venv.operator_python()
        return operator.OperatorProcess(kubeconfig, namespaces, log_path, extra, python)
    if len(namespaces) != 1:
        raise ValueError("mpi-operator watches one namespace (or all)")
    return MpiOperatorProcess(spec, kubeconfig, namespaces[0], log_path)
