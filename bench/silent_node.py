"""A small job's start while a big job is stuck on a silent node.

    .venv/bin/python -m bench.silent_node                  # 2,048 stuck workers
    .venv/bin/python -m bench.silent_node --workers 256    # a quick look
    .venv/bin/python -m bench.silent_node --operator-src /tmp/old/operator   # another version

Starts its own control plane and one operator (qps 50, burst 100: the defaults). The
latency of a small job is the time from its create to both of its worker pods
existing: the operator's first reconcile of it and its creates. It is measured for
`--samples` small jobs, one after another and `--spacing` seconds apart, in two
phases of the same run:

1. idle: nothing else in the cluster;
2. stuck: a job of `--workers` workers bound (`nodeName`) to a Node that no kubelet
   or kwok manages, every worker with a FailedMount Warning Event as a kubelet
   posts one, all waiting past the operator's slow-start threshold (15 s), so the
   operator explains them (pod_warnings.py).

The result is the ratio of the median latencies, stuck over idle (target: at most
1.2, issue #34), with the Event reads the operator made while stuck and its longest
event-loop block. Results in docs/benchmarks/silent-node.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
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
from .procs import log
from .takeover import _metric

SMALL_NS = "small"
STUCK_NS = "stuck"
NODE = "silent-node"
SLOW_START_S = 15.0  # observing.SLOW_START_SECONDS
READ_INTERVAL_S = 10.0  # pod_warnings.INTERVAL


def _jobs(namespace: str) -> str:
    return f"/apis/{manifests.HVJOB_API}/namespaces/{namespace}/{manifests.HVJOB_PLURAL}"


def _pods(client: Client, namespace: str, job: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=horovod.ai/job-name%3D{job}"
    items: list[dict[str, Any]] = (client.get(path) or {}).get("items") or []
    return items


def _small_latencies(client: Client, samples: int, tag: str, spacing: float = 0.0) -> list[float]:
    """Seconds from each small job's create to its two worker pods, one job at a time,
    `spacing` seconds apart: spread over the phase, not all inside one of its moments
    (a namespace read, a reconcile of the big job)."""
    latencies = []
    for i in range(samples):
        name = f"{tag}-{i:02d}"
        if i:
            time.sleep(spacing)
        began = time.monotonic()
        client.create(_jobs(SMALL_NS), manifests.horovod_job(name, 2, gang="None"))
        while len(_pods(client, SMALL_NS, name)) < 2:
            if time.monotonic() - began > 300:
                raise TimeoutError(f"small job {name} got no workers in 300 s")
            time.sleep(0.02)
        latencies.append(time.monotonic() - began)
        client.delete(f"{_jobs(SMALL_NS)}/{name}")
    return latencies


def _stick(client: Client, kubeconfig: Path, workers: int) -> float:
    """The big job, bound to the silent node, each worker with a FailedMount Event;
    the seconds until its last worker existed."""
    client.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    big = manifests.horovod_job("big", workers, gang="None")
    big["spec"]["worker"]["template"] = {"spec": {"nodeName": NODE}}
    began = time.monotonic()
    client.create(_jobs(STUCK_NS), big)
    while len(_pods(client, STUCK_NS, "big")) < workers:
        if time.monotonic() - began > 600:
            raise TimeoutError("the big job's workers were not all created in 600 s")
        time.sleep(1.0)
    created = time.monotonic() - began
    log(f"{workers} workers created in {created:.0f}s; posting a FailedMount Event for each")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def post(index: int) -> None:
        pod = f"big-worker-{index}"
        own = Client(kubeconfig, user_agent="horovod-bench-silent-node")
        try:
            own.create(
                f"/api/v1/namespaces/{STUCK_NS}/events",
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": f"{pod}.failedmount"},
                    "involvedObject": {"kind": "Pod", "name": pod, "namespace": STUCK_NS},
                    "type": "Warning",
                    "reason": "FailedMount",
                    "message": f'MountVolume.SetUp failed for volume "data": pvc "data-{index}" '
                    "not found",
                    "source": {"component": "kubelet", "host": NODE},
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
            )
        finally:
            own.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(post, range(workers)))
    return created


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.operator_src:
        # The operator process inherits this (localcluster/operator.py).
        os.environ["PYTHONPATH"] = str(Path(args.operator_src).resolve())
    out = Path(args.out)
    impl = control_plane.fresh(args.dir, args.port_base)
    layout = impl.layout
    client = Client(layout.kubeconfig, user_agent="horovod-bench-silent-node")
    op = None
    try:
        control_plane.install_horovod_crd(impl)
        for namespace in (SMALL_NS, STUCK_NS):
            create_namespace(client, namespace)
        op = operator.OperatorProcess(layout.kubeconfig, [SMALL_NS, STUCK_NS], out / "operator.log")
        op.start_and_wait(timeout=300)
        _small_latencies(client, 2, "warm")  # imports, connections, first caches
        idle = _small_latencies(client, args.samples, "idle", args.spacing)
        log(f"idle: median {statistics.median(idle):.3f}s")

        created = _stick(client, layout.kubeconfig, args.workers)
        before = op.metrics()
        stuck_began = time.monotonic()
        # Every worker past the slow-start threshold and the operator's first read.
        time.sleep(SLOW_START_S + READ_INTERVAL_S + 2)
        stuck = _small_latencies(client, args.samples, "stuck", args.spacing)
        # A minute in all (--window), so that the read count covers several intervals.
        time.sleep(max(0.0, args.window - (time.monotonic() - stuck_began)))
        stuck_s = time.monotonic() - stuck_began
        after = op.metrics()
        log(f"stuck: median {statistics.median(stuck):.3f}s")

        def delta(verb: str) -> float:
            name = "horovod_operator_api_requests_total"
            line = f'{name}{{kind="Event",verb="{verb}"}}'  # as prometheus_client orders them
            return _metric(after, line) - _metric(before, line)

        reads = sum(delta(verb) for verb in ("GET", "LIST"))

        status = client.get(f"{_jobs(STUCK_NS)}/big") or {}
        stalled: dict[str, Any] = next(
            (
                c
                for c in (status.get("status") or {}).get("conditions") or []
                if c.get("type") == "Stalled" and c.get("status") == "True"
            ),
            {},
        )
        ratio = statistics.median(stuck) / statistics.median(idle)
        return {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "operator_src": args.operator_src or "this checkout",
            "workers": args.workers,
            "samples": args.samples,
            "big_job_workers_created_s": round(created, 1),
            "small_job_latency_s": {
                "idle": {"median": round(statistics.median(idle), 3), "max": round(max(idle), 3)},
                "stuck": {
                    "median": round(statistics.median(stuck), 3),
                    "max": round(max(stuck), 3),
                },
            },
            "ratio_stuck_over_idle": round(ratio, 2),
            "event_reads_while_stuck": {
                "requests": reads,
                "seconds": round(stuck_s, 1),
                "per_minute": round(reads * 60 / stuck_s, 1),
            },
            "loop_lag_max_s": round(
                _metric(after, "horovod_operator_event_loop_lag_max_seconds"), 3
            ),
            "big_job_stalled": {k: stalled.get(k) for k in ("reason", "message")},
            "target": {"ratio_stuck_over_idle": 1.2},
        }
    finally:
        if op is not None:
            op.stop()
        client.close()
        impl.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.silent_node", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--spacing", type=float, default=3.0, help="seconds between samples")
    parser.add_argument(
        "--window", type=float, default=60, help="seconds stuck over which Event reads are counted"
    )
    parser.add_argument(
        "--operator-src", default="", help="run the operator package from this folder"
    )
    parser.add_argument("--dir", default=str(REPO / ".work" / "silent-node-cluster"))
    parser.add_argument("--port-base", type=int, default=18900)  # apart from the others
    parser.add_argument("--out", default=str(REPO / ".work" / "silent-node"))
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = run(args)
    (Path(args.out) / "silent-node.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
