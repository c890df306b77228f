"""The benchmark's harness: its control plane (started, or reused with --reuse), the
CRDs of the operators under test, a namespace per measurement, each operator as a
process (profiled with --profile), and the API server's audit log, from which each
operator's requests are counted. bench/run.py's scenarios run on it."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from localcluster import crds, gobuild
from localcluster.cluster import Cluster, Layout
from localcluster.kube import Client
from localcluster.namespaces import create_namespace
from localcluster.operator import OperatorProcess
from localcluster.poll import wait_for
from localcluster.trainer import TrainerProcess
from localcluster.trainer import crd_files as trainer_crd_files

from . import audit, manifests
from .control_plane import HV_CRD
from .procs import OperatorSpec, log, mpi_crd, operator_process

BENCH_NODE_PREFIX = "bench-gpu-"
AUDIT_SETTLE_POLL = 1.5  # seconds between two readings of the audit log
AUDIT_SETTLE_MAX = 30.0


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = uuid.uuid4().hex[:5]
        self.out = Path(args.out)
        self.logs = Path(args.dir).resolve().parent / f"{Path(args.dir).name}-logs"
        self.impl: Cluster | None = None
        self.owned_cluster = False
        self.client: Client | None = None
        self.audit_path: Path | None = None
        self.results: dict[str, Any] = {}

    def cluster_up(self) -> None:
        args = self.args
        if args.reuse:
            layout = Layout.load(Path(args.reuse).resolve())
            self.impl = Cluster(layout)
            if not self.impl.status()["apiserver_ready"]:
                raise SystemExit(f"--reuse {args.reuse}: no ready cluster there")
        else:
            layout = Layout(root=Path(args.dir).resolve(), port_base=args.port_base, audit=True)
            self.impl = Cluster(layout)
            self.impl.down(quiet=True)
            gobuild.build()
            self.impl.up()
            self.owned_cluster = True
        impl = self.impl
        # Room for the 512-worker job and the 100 x 8 burst at once: 8 nodes x 256 GPUs.
        if args.nodes > 0:
            impl.add_kwok_nodes(args.nodes, args.node_gpus, prefix=BENCH_NODE_PREFIX)
            impl.wait_nodes_ready()
        audit_log = impl.layout.logs / "audit.log"
        self.audit_path = audit_log if audit_log.exists() else None
        if self.audit_path is None:
            log(
                "no audit log (start the cluster with `hack/cluster.sh up --audit`): "
                "API counts are skipped"
            )
        self.client = Client(impl.layout.kubeconfig)
        self.logs.mkdir(parents=True, exist_ok=True)

    def install_crds(self, kinds: set[str]) -> None:
        """Every CRD the runs watch, before any watch starts: a Tracker lists its jobs
        before the operator under test is up."""
        assert self.impl is not None
        paths = [HV_CRD] if kinds & {"horovod", "baseline"} else []  # the baseline reads them too
        if "mpi" in kinds:
            paths.append(mpi_crd())
        if "trainer" in kinds:
            paths.extend(trainer_crd_files())
        for path in paths:
            self.impl.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in paths]
        crds.wait_established(self.impl.kubectl, names)

    def cluster_down(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.owned_cluster and self.impl is not None and not self.args.keep_cluster:
            self.impl.down(quiet=True)

    # --- namespaces and operators -----------------------------------------------------

    @contextlib.contextmanager
    def namespace(self, tag: str) -> Iterator[str]:
        assert self.client is not None
        ns = f"bench-{tag}-{self.run_id}"
        create_namespace(self.client, ns)
        try:
            yield ns
        finally:
            # A smoke run (bench --quick, bench.gangs --smoke) is not a measurement:
            # waiting for each namespace to go (5.5 s at least, the namespace
            # controller's pass; up to 16 s) was about 170 s of --quick's 274. Every
            # count is of one namespace's requests, so a deletion still under way
            # does not enter the next scenario's numbers.
            smoke = getattr(self.args, "quick", False) or getattr(self.args, "smoke", False)
            self.delete_namespace(ns, wait=not smoke)

    def delete_namespace(self, ns: str, timeout: float = 180, wait: bool = True) -> None:
        """Delete it; with `wait`, also wait until it is gone, so that the next
        measurement starts on a quiet cluster."""
        assert self.client is not None
        self.client.delete(f"/api/v1/namespaces/{ns}")
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while self.client.get(f"/api/v1/namespaces/{ns}") is not None:
            if time.monotonic() > deadline:
                log(f"namespace {ns} still terminating after {timeout:.0f}s; going on")
                return
            time.sleep(0.5)

    @contextlib.contextmanager
    def operator(self, spec: OperatorSpec, ns: str) -> Iterator[OperatorProcess | TrainerProcess]:
        assert self.impl is not None
        proc: OperatorProcess | TrainerProcess
        if spec.kind == "trainer":
            proc = TrainerProcess(
                self.impl.layout.kubeconfig, self.impl.kubectl, self.impl.layout.pki,
                self.logs / f"{ns}-trainer", self.logs / f"{ns}.log", spec.qps, spec.burst,
            )  # fmt: skip
            proc.start_and_wait()
            # Its runtime goes in once its validating webhook answers.
            wait_for(
                lambda: self.impl is not None and self.impl.kubectl(
                    "apply", "-f", "-", input=json.dumps(manifests.trainer_runtime()), check=False
                ).returncode == 0,
                60, 1.0, "the bench's ClusterTrainingRuntime accepted",
            )  # fmt: skip
        else:
            proc = operator_process(
                spec, self.impl.layout.kubeconfig, [ns], self.logs / f"{ns}.log"
            )
            proc.start_and_wait()
        profiler = self._profile(spec, proc, ns)
        time.sleep(0.5)  # the watches' initial lists are in flight right after readiness
        try:
            yield proc
        finally:
            proc.stop()
            if profiler is not None:
                try:
                    profiler.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    profiler.kill()

    def _profile(
        self, spec: OperatorSpec, proc: OperatorProcess | TrainerProcess, ns: str
    ) -> subprocess.Popen[bytes] | None:
        """py-spy on our operator (--profile): collapsed stacks, one file per scenario.
        Only samples of the thread that holds the GIL (--gil): the CPU the operator's
        Python spends. Without it, the HTTP client's threads waiting in socket reads
        filled most of the profile (docs/benchmarks/profile-ours-nogang-s512.txt)."""
        if not self.args.profile or spec.kind != "horovod":
            return None
        py_spy = Path(sys.executable).parent / "py-spy"
        if not py_spy.exists():
            log("--profile: py-spy is not installed (pip install -e .[bench])")
            return None
        out = self.logs / f"{ns}.pyspy.txt"
        return subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(proc.pid),
                "--rate",
                "100",
                "--gil",
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def audit_offset(self) -> int:
        if self.audit_path is None:
            return 0
        return self.audit_path.stat().st_size

    def api_counts(self, spec: OperatorSpec, ns: str, offset: int) -> dict[str, Counter[str]]:
        if self.audit_path is None:
            return {}
        # The audit backend flushes its batches every second, and an operator may
        # still be sending what its client rate limiter queued (the Events after a
        # burst's last status patches): count until two readings agree.
        previous: dict[str, Counter[str]] | None = None
        deadline = time.monotonic() + AUDIT_SETTLE_MAX
        while True:
            time.sleep(AUDIT_SETTLE_POLL)
            with self.audit_path.open("rb") as f:
                f.seek(offset)
                counts = audit.count_requests(f, spec.user_agents, [ns])
            if counts == previous or time.monotonic() > deadline:
                return counts
            previous = counts
