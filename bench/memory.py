"""The operator's memory with many managed pods and many finished jobs.

    .venv/bin/python -m bench.memory                       # 5,000 pods, 1,000 finished jobs
    .venv/bin/python -m bench.memory --pods 500 --finished-jobs 100   # a quick look

Starts its own control plane with kwok nodes, runs the operator on two
namespaces, and measures its resident memory (RSS) three times: idle with no
job, with `--pods` worker pods Running (jobs of 50 workers without GPUs, each
with its launcher), and after `--finished-jobs` finished jobs are added. The
chart's memory request and limit follow from these numbers
(docs/benchmarks/memory.md says how).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localcluster import operator
from localcluster.kube import Client
from localcluster.namespaces import create_namespace
from localcluster.paths import REPO

from . import control_plane, manifests
from .procs import OperatorSpec, log, operator_process, rss_mb

RUNNING_NS = "mem-running"
FINISHED_NS = "mem-finished"
WORKERS_PER_JOB = 50


def _jobs(ns: str) -> str:
    return f"/apis/{manifests.HVJOB_API}/namespaces/{ns}/{manifests.HVJOB_PLURAL}"


def _running_job(name: str, workers: int) -> dict[str, Any]:
    job = manifests.horovod_job(name, workers)
    # No GPUs: the kwok nodes are many-CPU nodes here; only the pod count matters.
    job["spec"]["worker"]["resources"] = {"limits": {"cpu": "10m", "memory": "16Mi"}}
    return job


def _settled_rss(pid: int, window: float = 10.0) -> float:
    """RSS once it stops growing for `window` seconds (at most 3 minutes)."""
    deadline = time.monotonic() + 180
    last = rss_mb(pid)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss_mb(pid)
        if now > last + 0.5:
            stable_since = time.monotonic()
        last = max(last, now)
        if time.monotonic() - stable_since >= window:
            break
    return round(rss_mb(pid), 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    impl = control_plane.fresh(args.dir, args.port_base)
    layout = impl.layout
    client = Client(layout.kubeconfig, user_agent="horovod-bench-memory")
    op: operator.OperatorProcess | None = None
    try:
        impl.add_kwok_nodes(8, 0, prefix="mem-")
        impl.wait_nodes_ready()
        control_plane.install_horovod_crd(impl)
        for ns in (RUNNING_NS, FINISHED_NS):
            create_namespace(client, ns)
        spec = OperatorSpec("ours", "horovod-operator", "horovod", args.qps, args.burst)
        op = operator_process(
            spec,
            layout.kubeconfig,
            [RUNNING_NS, FINISHED_NS],
            Path(args.out) / "memory-operator.log",
        )
        op.start_and_wait()
        idle = _settled_rss(op.pid, 5.0)
        log(f"idle, no job: {idle} MB")

        jobs = max(1, args.pods // WORKERS_PER_JOB)
        started = time.monotonic()
        for i in range(jobs):
            client.create(_jobs(RUNNING_NS), _running_job(f"big{i:03d}", WORKERS_PER_JOB))
        while True:
            items = (client.get(_jobs(RUNNING_NS)) or {}).get("items") or []
            running = sum(1 for j in items if (j.get("status") or {}).get("phase") == "Running")
            if running == jobs:
                break
            if time.monotonic() - started > args.timeout:
                raise TimeoutError(f"{running}/{jobs} jobs Running after {args.timeout}s")
            time.sleep(3)
        pods = len((client.get(f"/api/v1/namespaces/{RUNNING_NS}/pods") or {}).get("items") or [])
        with_pods = _settled_rss(op.pid)
        took = time.monotonic() - started
        log(f"{pods} pods Running ({jobs} jobs) after {took:.0f}s: {with_pods} MB")

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def make(i: int) -> None:
            name = f"done{i:04d}"
            client_i = Client(layout.kubeconfig, user_agent="horovod-bench-memory")
            try:
                client_i.create(_jobs(FINISHED_NS), manifests.horovod_job(name, 8, "None"))
                status = {"status": manifests.finished_horovod_status(now)}
                client_i.merge_patch(f"{_jobs(FINISHED_NS)}/{name}/status", status)
            finally:
                client_i.close()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(args.finished_jobs)))
        with_finished = _settled_rss(op.pid)
        log(f"+ {args.finished_jobs} finished jobs: {with_finished} MB")
        return {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "pods": pods,
            "running_jobs": jobs,
            "finished_jobs": args.finished_jobs,
            "rss_mb": {
                "idle": idle,
                "with_pods": with_pods,
                "with_pods_and_finished": with_finished,
            },
        }
    finally:
        if op is not None:
            op.stop()
        client.close()
        impl.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--finished-jobs", type=int, default=1000)
    parser.add_argument("--qps", type=float, default=50)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--dir", default=str(REPO / ".work" / "memory-cluster"))
    parser.add_argument("--port-base", type=int, default=18400)
    parser.add_argument("--out", default=str(REPO / ".work" / "memory"))
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = run(args)
    (Path(args.out) / "memory.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
