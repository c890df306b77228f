"""Benchmarks: our operator against kubeflow/mpi-operator on the same local control plane.

    .venv/bin/python -m bench                 # the default run (several minutes)
    .venv/bin/python -m bench --quick         # one small case of each kind; CI smoke
    .venv/bin/python -m bench --reuse DIR     # against a cluster already up (hack/cluster.sh)

Starts its own control plane (localcluster, audit log on) unless --reuse is
given, adds kwok GPU nodes with room for the largest job and the burst, builds
mpi-operator from the Go module proxy, and runs every scenario against each
operator configuration in turn, one operator process at a time, each scoped to
fresh namespaces. Prints a table, writes results JSON and PNG plots.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import subprocess
import time
import traceback
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localcluster import gobuild
from localcluster.cluster import SIM_EXIT_CODE, SIM_PHASE, Cluster
from localcluster.paths import REPO
from localcluster.versions import read_versions

from . import audit, manifests, report
from .harness import Harness
from .procs import (
    OperatorSpec,
    Sampler,
    build_mpi_operator,
    cpu_seconds,
    log,
    mpi_version,
    rss_mb,
)
from .stats import summarize
from .tracker import Tracker

DEFAULT_OUT = REPO / "docs" / "benchmarks"
QUICK_OUT = REPO / ".work" / "bench-quick"
DEFAULT_DIR = REPO / ".work" / "cluster-bench"

Obj = dict[str, Any]


# --- configuration ---------------------------------------------------------------------------


def operator_specs(
    qps: float, burst: int, which: list[str], ours_args: list[str] | None = None
) -> list[OperatorSpec]:
    specs = {
        "ours": OperatorSpec("ours", "horovod-operator", "horovod", qps, burst, ours_args or []),
        # The same work as mpi-operator does: its pods are scheduled one by one, ours
        # by default as a native gang (the kube-scheduler holds every worker until
        # the whole group is there, then binds them).
        "ours-nogang": OperatorSpec(
            "ours-nogang",
            "horovod-operator (gang.policy None, as mpi-operator schedules)",
            "horovod",
            qps,
            burst,
            ours_args or [],
            gang="None",
        ),
        "mpi": OperatorSpec("mpi", f"mpi-operator (QPS {qps:g}/{burst})", "mpi", qps, burst),
        # Its best configuration: the same client QPS/burst as ours and its event
        # queue's token bucket (10/s, burst 100 as shipped) raised out of the way.
        "mpi-tuned": OperatorSpec(
            "mpi-tuned",
            f"mpi-operator tuned (QPS {qps:g}/{burst}, queue 10000/s burst 100000)",
            "mpi",
            qps,
            burst,
            ["--controller-queue-rate-limit=10000", "--controller-queue-burst=100000"],
        ),
        "mpi-defaults": OperatorSpec(
            "mpi-defaults", "mpi-operator (defaults, QPS 5/10)", "mpi", 5, 10
        ),
        # The second peer: Kubeflow Trainer v2 (a TrainJob on a JobSet) at our client rate.
        "trainer": OperatorSpec(
            "trainer",
            f"Kubeflow Trainer v2.3.0 + JobSet v0.12.0 (QPS {qps:g}/{burst})",
            "trainer",
            qps,
            burst,
        ),
        # The physical limit: the same objects from a minimal client (bench.baseline).
        "baseline": OperatorSpec(
            "baseline", f"minimal client (QPS {qps:g}/{burst})", "baseline", qps, burst
        ),
        "baseline-unlimited": OperatorSpec(
            "baseline-unlimited", "minimal client (no client rate limit)", "baseline", 0, 0
        ),
        # The limit for a launcher that waits for its workers, as both operators' do.
        "baseline-ordered": OperatorSpec(
            "baseline-ordered",
            f"minimal client, launcher once the workers are Ready (QPS {qps:g}/{burst})",
            "baseline",
            qps,
            burst,
            ["--ordered"],
        ),
    }
    return [specs[k] for k in which]


def settled_cpu(pid: int, limit: float = 120.0) -> tuple[float, float]:
    """A process's CPU seconds since it started, once it stays quiet for two seconds in
    a row (at most `limit` seconds), and how long that took."""
    started = time.monotonic()
    quiet = 0
    last = cpu_seconds(pid)
    while quiet < 2 and time.monotonic() - started < limit:
        time.sleep(1.0)
        cur = cpu_seconds(pid)
        quiet = quiet + 1 if cur - last < 0.03 else 0
        last = cur
    return last, time.monotonic() - started


def plan(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        return {
            "sizes": [2],
            "repeats": {2: 1},
            "repeats_defaults": {2: 1},
            "burst_jobs": 3,
            "burst_workers": 2,
            "burst_operators": ["ours", "ours-nogang", "mpi-tuned", "mpi", "trainer"],
            "idle_jobs": 10,
            "idle_window": 3.0,
            "idle_operators": ["ours", "mpi-tuned", "mpi"],
        }
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]  # "" runs no single job
    return {
        "sizes": sizes,
        "repeats": {
            s: (
                args.repeats
                if s <= 8
                else max(2, args.repeats // 2)
                if s <= 64
                else args.repeats_large
            )
            for s in sizes
        },
        # QPS 5 makes a 512-worker job take ~2 minutes: one sample there.
        "repeats_defaults": {s: (args.repeats if s <= 8 else 2 if s <= 64 else 1) for s in sizes},
        "burst_jobs": args.burst_jobs,
        "burst_workers": 8,
        "burst_operators": ["ours", "ours-nogang", "mpi-tuned", "mpi", "trainer"]
        + (["mpi-defaults"] if args.burst_defaults else []),
        "idle_jobs": args.idle_jobs,
        "idle_window": 15.0,
        "idle_operators": ["ours", "mpi"],
    }


# --- helpers ---------------------------------------------------------------------------------


def jobs_path(spec: OperatorSpec, ns: str) -> str:
    if spec.kind in ("horovod", "baseline"):
        return f"/apis/{manifests.HVJOB_API}/namespaces/{ns}/{manifests.HVJOB_PLURAL}"
    if spec.kind == "trainer":
        return f"/apis/{manifests.TRAINER_API}/namespaces/{ns}/{manifests.TRAINJOB_PLURAL}"
    return f"/apis/{manifests.MPIJOB_API}/namespaces/{ns}/{manifests.MPIJOB_PLURAL}"


def job_manifest(spec: OperatorSpec, name: str, workers: int, clean: str = "Running") -> Obj:
    if spec.kind in ("horovod", "baseline"):
        return manifests.horovod_job(name, workers, clean, gang=spec.gang)
    if spec.kind == "trainer":
        return manifests.train_job(name, workers)  # JobSet keeps the pods: no clean policy
    return manifests.mpi_job(name, workers, clean, gang=spec.gang)


def phase_fn(spec: OperatorSpec) -> Callable[[Obj], str | None]:
    if spec.kind == "trainer":
        return manifests.trainer_phase
    return manifests.horovod_phase if spec.kind == "horovod" else manifests.mpi_phase


def reports_running(spec: OperatorSpec) -> bool:
    """A TrainJob says only Complete or Failed: no "create -> Running" to time."""
    return spec.kind != "trainer"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class Bench(Harness):
    """The scenarios (single jobs, a burst, idle memory) on the harness."""

    def warm_up(self, specs: list[OperatorSpec]) -> dict[str, float]:
        """Create and delete one job of each kind before anything is timed, with no
        operator running. The API server's first write of a custom resource kind takes
        seconds here (2.0 s for the first HorovodJob, then 3 ms): without this the
        first configuration measured pays it in its first sample."""
        assert self.client is not None
        took: dict[str, float] = {}
        with self.namespace("warmup") as ns:
            for spec in {s.kind: s for s in specs}.values():
                path = jobs_path(spec, ns)
                if path in took:
                    continue  # the baseline's jobs are HorovodJobs
                t0 = time.monotonic()
                try:
                    self.client.create(path, job_manifest(spec, "warmup", 1))
                except Exception as error:  # a warm-up that fails costs nothing
                    log(f"warm-up of {path} failed: {error}")
                    continue
                took[path] = round(time.monotonic() - t0, 3)
                self.client.delete(f"{path}/warmup")
        for path, seconds in took.items():
            log(f"first create of {path.rsplit('/', 1)[-1]}: {seconds:.3f}s (not timed)")
        return {path.rsplit("/", 1)[-1]: seconds for path, seconds in took.items()}

    # --- scenarios ---------------------------------------------------------------------

    def single(self, spec: OperatorSpec, size: int, repeats: int) -> dict[str, Any]:
        """1 job of `size` workers, `repeats` times, one after the other."""
        assert self.client is not None
        client = self.client
        # An unlimited client (qps 0) is timed as one at 1,000/s.
        timeout = 60 + 3 * (size + 20) / (spec.qps or 1000.0)
        if spec.kind == "mpi":
            # mpi-operator enqueues every pod event through a token bucket of 10/s (burst 100,
            # --controller-queue-rate-limit): a big job's ~4 events per pod queue up for minutes.
            timeout += 4 * size / 10
        samples: dict[str, list[float]] = {
            k: [] for k in ("workers", "pods", "running", "status_propagation")
        }
        with self.namespace(f"{spec.key}-s{size}") as ns:
            tracker = Tracker(client, ns, jobs_path(spec, ns), phase_fn(spec)).start()
            offset = self.audit_offset()
            load = loadavg()
            with self.operator(spec, ns) as op:
                sampler = Sampler(op.pids).start()
                for r in range(repeats):
                    one = self._single_job(spec, ns, tracker, f"j{r}", size, timeout)
                    for key, value in one.items():
                        samples[key].append(value)
                    log(
                        f"{spec.key} 1x{size} #{r}: "
                        + ", ".join(f"{k} {v:.2f}s" for k, v in one.items())
                    )
                    # cleanPodPolicy Running: the operator deletes the workers now; the next
                    # job starts once they are gone, so it does not queue behind the deletes.
                    with contextlib.suppress(TimeoutError):
                        tracker.wait(
                            functools.partial(tracker.workers_gone, f"j{r}"),
                            timeout,
                            f"workers of {ns}/j{r} deleted",
                        )
                    time.sleep(0.5)
                proc_stats = sampler.stop()
            tracker.stop()
            counts = self.api_counts(spec, ns, offset)
        result: dict[str, Any] = {k: summarize(v) for k, v in samples.items()}
        result["process"] = proc_stats
        result["loadavg"] = load
        if counts:
            result["api_per_job"] = audit.per_job(counts["namespaced"], repeats)
            result["api_operator_wide"] = dict(counts["other"])
        return result

    def _single_job(
        self, spec: OperatorSpec, ns: str, tracker: Tracker, name: str, size: int, timeout: float
    ) -> dict[str, float]:
        """Create one job, wait for its pods and Running, finish its launcher, time it all."""
        assert self.client is not None
        client = self.client
        t0 = time.monotonic()
        client.create(jobs_path(spec, ns), job_manifest(spec, name, size))
        tracker.wait(lambda: tracker.all_pods(name, size), timeout, f"{size} pods of {ns}/{name}")
        t_workers, t_pods = tracker.pods_created_at(name)
        if spec.kind == "baseline":
            # Nothing reconciles: no status to wait for, and the pods go by our hand
            # (the next repeat starts once they are gone, as for the operators).
            selector = urllib.parse.quote(f"horovod.ai/job-name={name}")
            client.request(
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}&gracePeriodSeconds=0",
            )
            return {"workers": t_workers - t0, "pods": t_pods - t0}
        t_running = None
        if reports_running(spec):
            tracker.wait(
                lambda: tracker.phase_at(name, "Running") is not None,
                timeout,
                f"{ns}/{name} Running",
            )
            t_running = tracker.phase_at(name, "Running")
        launcher = tracker.launcher_pod(name)
        annotations = {SIM_PHASE: "Succeeded", SIM_EXIT_CODE: "0"}
        client.merge_patch(
            f"/api/v1/namespaces/{ns}/pods/{launcher}", {"metadata": {"annotations": annotations}}
        )
        tracker.wait(
            lambda: (
                tracker.phase_at(name, "Succeeded") is not None
                and tracker.pod_phase_at(launcher, "Succeeded") is not None
            ),
            timeout,
            f"{ns}/{name} Succeeded",
        )
        t_done = tracker.phase_at(name, "Succeeded")
        t_launcher = tracker.pod_phase_at(launcher, "Succeeded")
        assert t_done is not None and t_launcher is not None
        times = {
            "workers": t_workers - t0,
            "pods": t_pods - t0,
            "status_propagation": t_done - t_launcher,
        }
        if t_running is not None:
            times["running"] = t_running - t0
        if spec.kind == "trainer":
            # JobSet keeps a finished job's pods: deleted here, so that the next repeat
            # starts on a quiet cluster as for the others (not timed).
            client.delete(f"{jobs_path(spec, ns)}/{name}")
        return times

    def burst(self, spec: OperatorSpec, jobs: int, workers: int) -> dict[str, Any]:
        """`jobs` jobs of `workers` workers created at once."""
        assert self.client is not None
        client = self.client
        expected = jobs * (workers + 1)
        timeout = 120 + 3 * expected * 2 / (spec.qps or 1000.0)
        if spec.kind == "mpi":
            timeout += 4 * expected / 10  # its event queue's 10/s token bucket, as in single()
        names = [f"b{i:03d}" for i in range(jobs)]
        with self.namespace(f"{spec.key}-burst") as ns:
            tracker = Tracker(client, ns, jobs_path(spec, ns), phase_fn(spec)).start()
            offset = self.audit_offset()
            load = loadavg()
            with self.operator(spec, ns) as op:
                sampler = Sampler(op.pids).start()
                bodies = [job_manifest(spec, n, workers) for n in names]
                path = jobs_path(spec, ns)
                t0 = time.monotonic()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda body: client.create(path, body), bodies))
                t_submitted = time.monotonic() - t0
                tracker.wait(
                    lambda: all(tracker.all_pods(n, workers) for n in names),
                    timeout,
                    f"{expected} pods in {ns}",
                )
                per_job_pods = [tracker.pods_created_at(n)[1] - t0 for n in names]
                running: list[float] = []
                if reports_running(spec):
                    tracker.wait(
                        lambda: all(tracker.phase_at(n, "Running") is not None for n in names),
                        timeout,
                        f"{jobs} jobs Running in {ns}",
                    )
                    running = [(tracker.phase_at(n, "Running") or 0.0) - t0 for n in names]
                proc_stats = sampler.stop()
                # Counted while the operator still runs: what its client rate limiter
                # queued behind the last status patches (the jobs' Running Events) is
                # part of starting the jobs; stopping it first cut those off.
                counts = self.api_counts(spec, ns, offset)
            tracker.stop()
        log(
            f"{spec.key} burst {jobs}x{workers}: all pods {max(per_job_pods):.2f}s, "
            f"all Running {max(running, default=float('nan')):.2f}s, "
            f"cpu {proc_stats['cpu_seconds']}s, "
            f"rss peak {proc_stats['rss_peak_mb']} MB"
        )
        result: dict[str, Any] = {
            "jobs": jobs,
            "workers": workers,
            "submit_seconds": round(t_submitted, 3),
            "all_pods": round(max(per_job_pods), 3),
            "all_running": round(max(running), 3) if running else None,
            "job_pods": summarize(per_job_pods),
            "job_running": summarize(running),
            "process": proc_stats,
            "loadavg": load,
        }
        if counts:
            result["api_per_job"] = audit.per_job(counts["namespaced"], jobs)
            result["api_operator_wide"] = dict(counts["other"])
        return result

    def idle(self, spec: OperatorSpec, jobs: int, window: float) -> dict[str, Any]:
        """RSS and CPU of an operator started with `jobs` finished jobs present."""
        assert self.client is not None
        client = self.client
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.namespace(f"{spec.key}-idle") as ns:
            path = jobs_path(spec, ns)

            def make(i: int) -> None:
                name = f"done{i:04d}"
                client.create(path, job_manifest(spec, name, 8, clean="None"))
                status = (
                    manifests.finished_horovod_status(now)
                    if spec.kind == "horovod"
                    else manifests.finished_mpi_status(now)
                )
                client.merge_patch(f"{path}/{name}/status", {"status": status})

            t = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(make, range(jobs)))
            log(f"{spec.key} idle: {jobs} finished jobs made in {time.monotonic() - t:.1f}s")
            offset = self.audit_offset()
            load = loadavg()
            with self.operator(spec, ns) as op:
                total_cpu, settle = settled_cpu(op.pid)
                sampler = Sampler(op.pids).start()
                time.sleep(window)
                proc_stats = sampler.stop()
                rss = rss_mb(op.pid)
            counts = self.api_counts(spec, ns, offset)
        # What the jobs cost to start with: the same start with none, in the same run
        # (interpreter, imports, discovery and the first lists are in both).
        with self.namespace(f"{spec.key}-idle0") as empty, self.operator(spec, empty) as op:
            empty_cpu, _ = settled_cpu(op.pid)
        startup_cpu = max(0.0, total_cpu - empty_cpu)
        log(
            f"{spec.key} idle with {jobs} finished jobs: rss {rss:.1f} MB, "
            f"idle cpu {proc_stats['cpu_seconds']}s/{window:.0f}s, startup cpu {startup_cpu:.2f}s "
            f"({total_cpu:.2f}s, with no jobs {empty_cpu:.2f}s)"
        )
        result: dict[str, Any] = {
            "jobs": jobs,
            "rss_mb": round(rss, 1),
            "idle_cpu_seconds": proc_stats["cpu_seconds"],
            "idle_window_seconds": proc_stats["wall_seconds"],
            "startup_cpu_seconds": round(startup_cpu, 2),
            "startup_cpu_total_seconds": round(total_cpu, 2),
            "startup_cpu_no_jobs_seconds": round(empty_cpu, 2),
            "startup_settle_seconds": round(settle, 1),
            "loadavg": load,
        }
        if counts:
            result["api_requests_after_start"] = dict(counts["namespaced"])
        return result

    # --- the whole run -----------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        p = plan(args)
        specs = operator_specs(
            args.qps, args.burst, args.operators.split(","), args.ours_args.split()
        )
        kinds = {s.kind for s in specs}
        if "mpi" in kinds:
            build_mpi_operator()
        self.cluster_up()
        self.install_crds(kinds)
        warm = self.warm_up(specs)
        started = time.monotonic()
        res: dict[str, Any] = {
            "meta": meta(args, specs, p, self.impl),
            "single": {},
            "burst": {},
            "idle": {},
        }
        res["meta"]["first_create_seconds"] = warm
        res["meta"]["loadavg_start"] = loadavg()
        try:
            for size in p["sizes"]:
                for spec in specs:
                    reps = (p["repeats_defaults"] if spec.key == "mpi-defaults" else p["repeats"])[
                        size
                    ]
                    res["single"].setdefault(str(size), {})[spec.key] = self._guard(
                        functools.partial(self.single, spec, size, reps)
                    )
            for spec in specs:
                if spec.key in p["burst_operators"] and p["burst_jobs"]:
                    res["burst"][spec.key] = self._guard(
                        functools.partial(self.burst, spec, p["burst_jobs"], p["burst_workers"])
                    )
            for spec in specs:
                if spec.key in p["idle_operators"] and p["idle_jobs"]:
                    res["idle"][spec.key] = self._guard(
                        functools.partial(self.idle, spec, p["idle_jobs"], p["idle_window"])
                    )
        finally:
            res["meta"]["loadavg_end"] = loadavg()
            res["meta"]["duration_seconds"] = round(time.monotonic() - started, 1)
            res["ratios"] = report.ratios(res)
            self.results = res
        return res

    def _guard(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A failed scenario is recorded, not fatal: the other numbers still come out."""
        try:
            return fn()
        except Exception as error:
            # The traceback too: "KeyError: 'x'" alone names no line.
            log(f"scenario failed: {type(error).__name__}: {error}\n{traceback.format_exc()}")
            return {"error": clip(f"{type(error).__name__}: {error}")}


def clip(message: str, head: int = 300, tail: int = 1700) -> str:
    """A long error's first line and its end: a process's exit carries its log's last
    lines, and the cause is the last of them (CI once kept only the first 2,000
    characters of Trainer's, and lost "address already in use")."""
    if len(message) <= head + tail:
        return message
    return f"{message[:head]}\n[...]\n{message[-tail:]}"


def meta(
    args: argparse.Namespace,
    specs: list[OperatorSpec],
    p: dict[str, Any],
    impl: Cluster | None,
) -> dict[str, Any]:
    versions = read_versions()
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 2**20, 1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "operator"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if dirty:
        commit += " + uncommitted operator changes"
    kopf_version = "unknown"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        kopf_version = version("kopf")
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": bool(args.quick),
        "machine": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "memory_gb": mem_gb,
            "kernel": platform.release(),
            "note": "shared with other workloads; see loadavg fields",
        },
        "versions": {
            "kubernetes": versions.get("KUBERNETES_VERSION"),
            "etcd": versions.get("ETCD_VERSION"),
            "kwok": versions.get("KWOK_VERSION"),
            "mpi_operator": mpi_version(),
            "kubeflow_trainer": gobuild.tool("trainer").version(),
            "jobset": gobuild.tool("jobset").version(),
            "horovod_operator_commit": commit,
            "kopf": kopf_version,
            "python": platform.python_version(),
        },
        "operators": {
            s.key: {"label": s.label, "qps": s.qps, "burst": s.burst, "extra_args": s.extra}
            for s in specs
        },
        "plan": {
            k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()})
            for k, v in p.items()
        },
        "kwok_nodes": {"count": args.nodes, "gpus_each": args.node_gpus},
    }


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new`'s scenario results over `old`'s (a rerun of some cases), ratios recomputed."""
    out: dict[str, Any] = json.loads(json.dumps(old))
    for section in ("single", "burst", "idle"):
        for key, value in (new.get(section) or {}).items():
            if section == "single":
                out.setdefault("single", {}).setdefault(key, {}).update(value)
            else:
                out.setdefault(section, {})[key] = value
    runs = out["meta"].setdefault("merged_runs", [])
    runs.append(
        {
            "date": new["meta"]["date"],
            "commit": new["meta"]["versions"].get("horovod_operator_commit"),
            "operators": list(new["meta"]["operators"]),
            "plan": new["meta"]["plan"],
            "loadavg_start": new["meta"].get("loadavg_start"),
            "loadavg_end": new["meta"].get("loadavg_end"),
        }
    )
    for key, value in new["meta"]["operators"].items():
        out["meta"]["operators"].setdefault(key, value)
    out["ratios"] = report.ratios(out)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="one small case of each kind")
    parser.add_argument(
        "--out", help=f"results dir [{DEFAULT_OUT}; with --quick {QUICK_OUT}, not committed]"
    )
    parser.add_argument("--dir", default=str(DEFAULT_DIR), help="cluster state dir [%(default)s]")
    parser.add_argument("--port-base", type=int, default=17800, help="cluster ports [%(default)s]")
    parser.add_argument("--reuse", help="state dir of a running cluster to use instead")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster up")
    parser.add_argument(
        "--operators",
        default=(
            "ours,ours-nogang,mpi-tuned,mpi,mpi-defaults,trainer,"
            "baseline,baseline-ordered,baseline-unlimited"
        ),
        help="which to run [%(default)s]",
    )
    parser.add_argument("--qps", type=float, default=50.0, help="client QPS of both [%(default)s]")
    parser.add_argument("--burst", type=int, default=100, help="client burst of both [%(default)s]")
    parser.add_argument("--sizes", default="8,64,512", help="worker counts [%(default)s]")
    parser.add_argument(
        "--repeats",
        type=int,
        default=8,
        help="runs of the 8-worker job; half that at 64 [%(default)s]",
    )
    parser.add_argument(
        "--repeats-large", type=int, default=2, help="runs of jobs over 64 workers [%(default)s]"
    )
    parser.add_argument("--burst-jobs", type=int, default=100)
    parser.add_argument(
        "--burst-defaults",
        action="store_true",
        help="also run the burst against mpi-operator's defaults (about 5 minutes at QPS 5)",
    )
    parser.add_argument("--idle-jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=8, help="bench kwok nodes [%(default)s]")
    parser.add_argument("--node-gpus", type=int, default=256, help="GPUs per node [%(default)s]")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument(
        "--ours-args", default="", help="extra flags for our operator, e.g. '--batch-window 0.05'"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="merge into the existing results file (rerun some cases) instead of replacing it",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy our operator in every scenario (collapsed stacks beside the logs)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is None:
        args.out = str(QUICK_OUT if args.quick else DEFAULT_OUT)
    bench = Bench(args)
    try:
        results = bench.run()
    finally:
        bench.cluster_down()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "results-quick.json" if args.quick else "results.json"
    if args.merge and (out / name).exists():
        results = merge(json.loads((out / name).read_text()), results)
    (out / name).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(report.table(results))
    if not args.no_plots:
        written = report.plots(results, out, prefix="quick-" if args.quick else "")
        if not written:
            log("no plots: matplotlib is not installed (pip install -e '.[bench]')")
        for path in written:
            log(f"wrote {path}")
    log(f"wrote {out / name}")
    return 0
