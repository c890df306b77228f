"""Where one replica stops coping: grow to many jobs and pods on kwok, step by step.

    .venv/bin/python -m bench.ceiling                            # 10,000 jobs, 50,000 pods
    .venv/bin/python -m bench.ceiling --jobs 2000 --step 500     # a shorter look

Starts its own control plane with kwok nodes (room for every pod), runs one replica
of our operator (gang None, its client at --qps/--burst) and adds running jobs of
--workers workers (each job has those pods and its launcher: 4 workers make 5 pods)
in steps of --step jobs. The jobs keep their pods when they finish (cleanPodPolicy
None), so the cluster holds every pod it ever had: running ones and finished ones.
After each step it measures, on the operator:

- how long the step took: its creates to every one of its jobs Running;
- the time from a pod's change to the job's status (--probes jobs of the step
  have their launcher pod finish; from the launcher pod's Succeeded to the job's
  Succeeded, both as a watch of this process sees them): median, p95, p99 and max;
- resident memory, CPU seconds since the start, and the event loop's longest block
  (horovod_operator_event_loop_lag_max_seconds), the CPU the process spent in that
  block (near its length: our own work; far below: waiting for a core) and the
  longest garbage collection.

It stops early, saying so, when a step does not reach Running within --step-timeout:
that is the point where one replica no longer keeps up (or when --budget seconds of
growing are spent; the results so far are written after every step). At the end the
operator is restarted on everything there: how long it takes to be ready and to have
reconciled every job, and its memory once settled. Results in
docs/benchmarks/ceiling.md; timings are never asserted in tests.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localcluster import operator
from localcluster.cluster import SIM_EXIT_CODE, SIM_PHASE, Layout
from localcluster.kube import Client
from localcluster.namespaces import create_namespace
from localcluster.paths import REPO

from . import control_plane, manifests, stats
from .memory import _settled_rss
from .procs import cpu_seconds, log, rss_mb
from .run import loadavg
from .tracker import Tracker

NAMESPACE = "ceiling"
NODE_PREFIX = "kwok-ceiling-"
PODS_PER_NODE = 900  # kwok_node's capacity is 1000 pods


def _jobs_path() -> str:
    return f"/apis/{manifests.HVJOB_API}/namespaces/{NAMESPACE}/{manifests.HVJOB_PLURAL}"


def _metric(text: str, name: str) -> float:
    """The largest sample of a metric (with or without labels) in /metrics text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return max((float(value) for value in pattern.findall(text)), default=0.0)


def _create(layout: Layout, names: list[str], workers: int) -> None:
    """Create the jobs from 8 threads, each with its own client."""

    def create(chunk: list[str]) -> None:
        client = Client(layout.kubeconfig, user_agent="horovod-bench-ceiling")
        try:
            for name in chunk:
                job = manifests.horovod_job(name, workers, clean_pod_policy="None", gang="None")
                client.create(_jobs_path(), job)
        finally:
            client.close()

    chunks = [names[i::8] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, chunks))


def _all_running(tracker: Tracker, names: list[str]) -> Callable[[], bool]:
    return lambda: all(tracker.phase_at(name, "Running") is not None for name in names)


def _probe(client: Client, tracker: Tracker, names: list[str], timeout: float) -> list[float]:
    """Finish the launcher pod of each job; seconds from the pod's Succeeded to the job's."""
    launchers = {name: tracker.launcher_pod(name) for name in names}
    annotations = {SIM_PHASE: "Succeeded", SIM_EXIT_CODE: "0"}
    for pod in launchers.values():
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}"
        client.merge_patch(path, {"metadata": {"annotations": annotations}})
    tracker.wait(
        lambda: all(
            tracker.phase_at(n, "Succeeded") is not None
            and tracker.pod_phase_at(p, "Succeeded") is not None
            for n, p in launchers.items()
        ),
        timeout,
        f"{len(names)} probe jobs Succeeded",
    )
    seconds = []
    for name, pod in launchers.items():
        done, pod_done = tracker.phase_at(name, "Succeeded"), tracker.pod_phase_at(pod, "Succeeded")
        assert done is not None and pod_done is not None
        seconds.append(max(0.0, done - pod_done))
    return seconds


def _operator(layout: Layout, out: Path, name: str, args: argparse.Namespace) -> Any:
    extra = ["--qps", str(args.qps), "--burst", str(args.burst)]
    return operator.OperatorProcess(layout.kubeconfig, [NAMESPACE], out / f"{name}.log", extra)


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = Path(args.out)
    impl = control_plane.fresh(args.dir, args.port_base)
    layout = impl.layout
    pods_total = args.jobs * (args.workers + 1)
    nodes = math.ceil(pods_total / PODS_PER_NODE)
    impl.add_kwok_nodes(nodes, PODS_PER_NODE, prefix=NODE_PREFIX)
    impl.wait_nodes_ready(timeout=300)
    client = Client(layout.kubeconfig, user_agent="horovod-bench-ceiling")
    op: Any = None
    tracker: Tracker | None = None
    steps: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "plan": {
            "jobs": args.jobs,
            "workers": args.workers,
            "pods": pods_total,
            "step_jobs": args.step,
            "probes_per_step": args.probes,
            "operator_qps": args.qps,
            "operator_burst": args.burst,
            "kwok_nodes": nodes,
        },
        "load_at_start": loadavg(),
        "steps": steps,
    }
    try:
        control_plane.install_horovod_crd(impl)
        create_namespace(client, NAMESPACE)
        tracker = Tracker(client, NAMESPACE, _jobs_path(), manifests.horovod_phase).start()
        op = _operator(layout, out, "operator", args)
        op.start_and_wait(timeout=300)
        cpu0 = cpu_seconds(op.pid)
        made = 0
        grown = time.monotonic()
        while made < args.jobs:
            if args.budget and time.monotonic() - grown > args.budget:
                result["budget_spent"] = f"grown for {args.budget:.0f}s: {made} jobs made"
                log(result["budget_spent"])
                break
            names = [f"j{i:05d}" for i in range(made, min(args.jobs, made + args.step))]
            began = time.monotonic()
            _create(layout, names, args.workers)
            created_s = time.monotonic() - began
            step: dict[str, Any] = {"jobs": made + len(names), "created_s": round(created_s, 1)}
            try:
                tracker.wait(
                    _all_running(tracker, names),
                    args.step_timeout,
                    f"the {len(names)} jobs of the step Running",
                )
            except TimeoutError as error:
                step["stopped"] = str(error)
                steps.append(step)
                log(f"step to {step['jobs']} jobs: {error}; one replica no longer keeps up")
                break
            step["running_s"] = round(time.monotonic() - began, 1)
            probes = names[: args.probes]
            step["pod_to_status_s"] = stats.summarize(
                _probe(client, tracker, probes, args.step_timeout)
            )
            step["pods"] = len(tracker.pod_seen)
            metrics = op.metrics()
            step["rss_mb"] = round(rss_mb(op.pid), 1)
            step["cpu_s"] = round(cpu_seconds(op.pid) - cpu0, 1)
            step["loop_lag_max_s"] = round(
                _metric(metrics, "horovod_operator_event_loop_lag_max_seconds"), 3
            )
            # What the longest block was: the operator's own CPU, or waiting for a core.
            step["loop_lag_max_cpu_s"] = round(
                _metric(metrics, "horovod_operator_event_loop_lag_max_cpu_seconds"), 3
            )
            step["gc_pause_max_s"] = round(
                _metric(metrics, "horovod_operator_gc_pause_max_seconds"), 3
            )
            step["load"] = loadavg()
            steps.append(step)
            propagation = step["pod_to_status_s"]
            log(
                f"{step['jobs']} jobs, {step['pods']} pods: step Running in "
                f"{step['running_s']}s; pod -> status median {propagation['median']}s, "
                f"p95 {propagation['p95']}s, p99 {propagation['p99']}s; "
                f"rss {step['rss_mb']} MB, cpu {step['cpu_s']}s, "
                f"loop lag max {step['loop_lag_max_s']}s "
                f"(cpu {step['loop_lag_max_cpu_s']}s; longest gc {step['gc_pause_max_s']}s)"
            )
            made += len(names)
            save(result)  # a run stopped later keeps the steps measured so far
        result["settled_rss_mb"] = _settled_rss(op.pid)
        # A restart on everything there: start-up and the first reconcile of every job.
        op.stop()
        op = _operator(layout, out, "restarted", args)
        began = time.monotonic()
        ready_s = op.start_and_wait(timeout=600)
        jobs_there = made if not steps or "stopped" not in steps[-1] else steps[-1]["jobs"]

        def reconciled() -> bool:
            count = _metric(op.metrics(), "horovod_operator_reconcile_duration_seconds_count")
            return count >= jobs_there

        deadline = time.monotonic() + 900
        while not reconciled() and time.monotonic() < deadline:
            time.sleep(1.0)
        result["restart"] = {
            "jobs": jobs_there,
            "pods": len(tracker.pod_seen),
            "ready_s": round(ready_s, 1),
            "all_reconciled_s": round(time.monotonic() - began, 1) if reconciled() else None,
            "cpu_s": round(cpu_seconds(op.pid), 1),
            "settled_rss_mb": _settled_rss(op.pid),
        }
        result["load_at_end"] = loadavg()
        return result
    finally:
        if tracker is not None:
            tracker.stop()
        if op is not None:
            op.stop()
        client.close()
        if not args.keep_cluster:
            impl.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ceiling", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4, help="workers per job (+1 launcher)")
    parser.add_argument("--step", type=int, default=1000, help="jobs added per step")
    parser.add_argument(
        "--probes", type=int, default=100, help="jobs per step timed finishing (100: a p99)"
    )
    parser.add_argument("--step-timeout", type=float, default=1800)
    parser.add_argument(
        "--budget", type=float, default=0, help="seconds of growing, then the restart [no limit]"
    )
    parser.add_argument("--qps", type=float, default=200)
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--dir", default=str(REPO / ".work" / "ceiling-cluster"))
    parser.add_argument("--port-base", type=int, default=18800)  # apart from the others
    parser.add_argument("--out", default=str(REPO / ".work" / "ceiling"))
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(result: dict[str, Any]) -> None:
        (out / "ceiling.json").write_text(json.dumps(result, indent=2) + "\n")

    result = run(args, save)
    save(result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
