"""A standby taking over with many jobs: how long the loop blocks, and what it adds.

    .venv/bin/python -m bench.takeover                  # 10,000 finished jobs
    .venv/bin/python -m bench.takeover --jobs 1000      # a quick look

Starts its own control plane, creates `--jobs` finished HorovodJobs, and runs two
replicas of the operator with --leader-elect. The standby keeps its watch caches
warm but no per-job work (reconciler.py); when the leader stops (SIGTERM: it
releases the Lease), the standby takes over and reconciles every job. Measured on
the new leader:

- the time from the old leader's exit to the Lease naming the new one;
- its event loop's longest block (horovod_operator_event_loop_lag_max_seconds),
  as a standby and after taking over;
- its resident memory as a settled standby and once the takeover settled;
- its reconciles and API writes after the takeover (finished jobs need none).

Targets (issue #33): a takeover blocks the loop at most 0.5 s and adds at most
50 MB. Results in docs/benchmarks/takeover.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from localcluster import operator
from localcluster.cluster import Layout
from localcluster.kube import Client
from localcluster.namespaces import create_namespace
from localcluster.paths import REPO

from . import control_plane, manifests
from .memory import _settled_rss
from .procs import log

NAMESPACE = "takeover"
LEASE_ID = "horovod-operator-takeover"


def _jobs_path() -> str:
    return f"/apis/{manifests.HVJOB_API}/namespaces/{NAMESPACE}/{manifests.HVJOB_PLURAL}"


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples (with or without labels) in /metrics text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def _holder(client: Client) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE_ID}"
    lease = client.get(path) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _replica(layout: Layout, out: Path, name: str, args: argparse.Namespace) -> Any:
    extra = [
        "--leader-elect",
        "--leader-election-namespace", NAMESPACE,
        "--leader-election-id", LEASE_ID,
        "--qps", str(args.qps), "--burst", str(args.burst),
    ]  # fmt: skip
    return operator.OperatorProcess(layout.kubeconfig, [NAMESPACE], out / f"{name}.log", extra)


def _wait(what: str, check: Any, timeout: float, every: float = 0.05) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what} after {timeout:.0f}s")
        time.sleep(every)
    return time.monotonic() - began


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    impl = control_plane.fresh(args.dir, args.port_base)
    layout = impl.layout
    client = Client(layout.kubeconfig, user_agent="horovod-bench-takeover")
    replicas: list[Any] = []
    try:
        control_plane.install_horovod_crd(impl)
        create_namespace(client, NAMESPACE)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def make(i: int) -> None:
            name = f"done{i:05d}"
            client_i = Client(layout.kubeconfig, user_agent="horovod-bench-takeover")
            try:
                client_i.create(_jobs_path(), manifests.horovod_job(name, 8, "None"))
                status = {"status": manifests.finished_horovod_status(now)}
                client_i.merge_patch(f"{_jobs_path()}/{name}/status", status)
            finally:
                client_i.close()

        began = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            for done, _ in enumerate(pool.map(make, range(args.jobs)), 1):
                if done % 1000 == 0:
                    log(f"{done}/{args.jobs} finished jobs created")
        log(f"{args.jobs} finished jobs created in {time.monotonic() - began:.0f}s")

        leader = _replica(layout, out, "leader", args)
        leader.start_and_wait(timeout=300)
        _wait("the first replica leading", lambda: str(leader.pid) in _holder(client), 120)
        # The first leader reconciles every job once; the standby comes after that.
        _wait(
            "the first leader to settle",
            lambda: (
                _metric(leader.metrics(), "horovod_operator_reconcile_duration_seconds_count")
                >= args.jobs
            ),
            600,
            1.0,
        )
        standby = _replica(layout, out, "standby", args)
        ready_s = standby.start_and_wait(timeout=300)
        replicas += [leader, standby]
        standby_rss = _settled_rss(standby.pid)
        before = standby.metrics()
        standby_lag = _metric(before, "horovod_operator_event_loop_lag_max_seconds")
        log(f"standby ready after {ready_s:.1f}s, settled at {standby_rss} MB")

        stopped = time.monotonic()
        leader.stop()
        _wait("the standby leading", lambda: str(standby.pid) in _holder(client), 60)
        took_over = time.monotonic() - stopped
        _wait(
            "the new leader to reconcile every job",
            lambda: (
                _metric(standby.metrics(), "horovod_operator_reconcile_duration_seconds_count")
                >= args.jobs
            ),
            600,
            0.5,
        )
        reconciled = time.monotonic() - stopped
        leader_rss = _settled_rss(standby.pid)
        after = standby.metrics()
        lag = _metric(after, "horovod_operator_event_loop_lag_max_seconds")
        # Every API request the new leader made (finished jobs should need none).
        requests = re.findall(
            r'^horovod_operator_api_requests_total{verb="([^"]*)",kind="([^"]*)"} (\S+)$',
            after,
            re.M,
        )
        result = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "jobs": args.jobs,
            "standby_ready_s": round(ready_s, 1),
            "takeover_s": round(took_over, 2),
            "all_reconciled_s": round(reconciled, 1),
            "loop_lag_max_s": {"standby": round(standby_lag, 3), "after_takeover": round(lag, 3)},
            "rss_mb": {
                "standby": standby_rss,
                "leader_after_takeover": leader_rss,
                "added": round(leader_rss - standby_rss, 1),
            },
            "api_requests_after_takeover": {f"{v} {k}": float(n) for v, k, n in requests},
            "targets": {"loop_lag_max_s": 0.5, "rss_added_mb": 50},
        }
        return result
    finally:
        for replica in replicas:
            replica.stop()
        client.close()
        impl.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.takeover", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--qps", type=float, default=50)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--dir", default=str(REPO / ".work" / "takeover-cluster"))
    parser.add_argument("--port-base", type=int, default=18500)
    parser.add_argument("--out", default=str(REPO / ".work" / "takeover"))
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = run(args)
    (Path(args.out) / "takeover.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
