"""What a gang costs: our gang policies against mpi-operator with its own gangs.

docs/benchmarks compared our default (a native kube-scheduler gang) with
mpi-operator scheduling its pods one by one. Like for like, mpi-operator's gang
is Volcano's or scheduler-plugins' Coscheduling PodGroup (--gang-scheduling), so
here every configuration holds its workers until the whole group fits:

- ours:          gang.policy Auto (the native gang this control plane serves)
- ours-volcano:  gang.policy Volcano       (vc-scheduler places the group)
- ours-cosched:  gang.policy Coscheduling  (scheduler-plugins' scheduler)
- mpi-volcano:   mpi-operator --gang-scheduling=volcano
- mpi-cosched:   mpi-operator --gang-scheduling=scheduler-plugins-scheduler

mpi-operator runs at its best configuration (bench.run's mpi-tuned: our client
QPS/burst, its event queue's token bucket out of the way), with the launcher
created once the workers are Ready (as ours) and `schedulingPolicy.minAvailable`
set to the workers: its default minMember counts the launcher, which then never
exists, and the group never fits (docs/benchmarks/gangs.md).

One job of each size at a time, the same scenario as bench.run's single jobs;
the ratios are ours over mpi-operator's with the same gang scheduler, in one run.

    python -m bench.gangs [--sizes 8,64,512] [--repeats 3] [--repeats-large 1] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from localcluster import gangs
from localcluster.paths import REPO

from .procs import OperatorSpec, build_mpi_operator, log
from .run import Bench, loadavg, meta

DEFAULT_OUT = REPO / "docs" / "benchmarks"
# Each configuration and the peer it is compared with (the same gang scheduler).
PAIRS = {"ours-volcano": "mpi-volcano", "ours-cosched": "mpi-cosched", "ours": "mpi-volcano"}


def specs(qps: float, burst: int) -> list[OperatorSpec]:
    tuned = ["--controller-queue-rate-limit=10000", "--controller-queue-burst=100000"]
    cosched = gangs.SCHEDULER_NAME
    return [
        OperatorSpec("ours", "horovod-operator, native gang (Auto)", "horovod", qps, burst),
        OperatorSpec(
            "ours-volcano", "horovod-operator, gang.policy Volcano", "horovod", qps, burst,
            gang="Volcano",
        ),
        OperatorSpec(
            "ours-cosched", "horovod-operator, gang.policy Coscheduling", "horovod", qps, burst,
            gang="Coscheduling",
        ),
        OperatorSpec(
            "mpi-volcano", "mpi-operator tuned, --gang-scheduling=volcano", "mpi", qps, burst,
            [*tuned, "--gang-scheduling=volcano"], gang="Volcano",
        ),
        OperatorSpec(
            "mpi-cosched", f"mpi-operator tuned, --gang-scheduling={cosched}", "mpi", qps, burst,
            [*tuned, f"--gang-scheduling={cosched}"], gang="Coscheduling",
        ),
    ]  # fmt: skip


def ratios(single: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median create -> Running of each of ours over its peer's, per size."""
    out: dict[str, dict[str, float]] = {}
    for ours, peer in PAIRS.items():
        for size, case in single.get(ours, {}).items():
            theirs = single.get(peer, {}).get(size)
            if not theirs or "running" not in case or "running" not in theirs:
                continue
            out.setdefault(ours, {})[size] = round(
                case["running"]["median"] / theirs["running"]["median"], 3
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gangs", description=__doc__)
    parser.add_argument("--sizes", default="8,64,512", help="worker counts [%(default)s]")
    parser.add_argument("--repeats", type=int, default=3, help="jobs per size [%(default)s]")
    parser.add_argument("--repeats-large", type=int, default=1, help="above 64 [%(default)s]")
    parser.add_argument("--only", default="", help="comma-separated configurations to run")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--dir", default=str(REPO / ".work" / "cluster-gangs"))
    parser.add_argument("--port-base", type=int, default=19100)  # apart from the others
    parser.add_argument("--reuse", help="state dir of a running cluster to use instead")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--qps", type=float, default=50.0)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--node-gpus", type=int, default=256)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a check that every configuration runs, not a measurement: each case's "
        "namespace is deleted without waiting for it to go",
    )
    args = parser.parse_args()
    args.profile = args.quick = False
    chosen = specs(args.qps, args.burst)
    if args.only:
        keep = set(args.only.split(","))
        chosen = [s for s in chosen if s.key in keep]
    sizes = [int(s) for s in args.sizes.split(",")]
    build_mpi_operator()
    bench = Bench(args)
    bench.cluster_up()
    assert bench.impl is not None
    impl = bench.impl
    volcano = gangs.VolcanoScheduler(
        impl.layout.kubeconfig, impl.kubectl, bench.logs / "volcano", bench.logs / "volcano.log"
    )
    cosched = gangs.CoschedulingScheduler(
        impl.layout.kubeconfig, bench.logs / "cosched", bench.logs / "cosched.log"
    )
    started = time.monotonic()
    result: dict[str, Any] = {"single": {}}
    try:
        bench.install_crds({s.kind for s in chosen})
        gangs.install_crd(impl.kubectl, gangs.coscheduling_crd())
        log(f"Volcano's scheduler ready in {volcano.start():.1f}s")
        log(f"the coscheduling scheduler ready in {cosched.start():.1f}s")
        plan = {"sizes": sizes, "repeats": args.repeats, "repeats_large": args.repeats_large}
        result["meta"] = meta(args, chosen, plan, impl)
        result["meta"]["smoke"] = args.smoke
        result["meta"]["first_create_seconds"] = bench.warm_up(chosen)
        result["meta"]["loadavg_start"] = loadavg()
        for size in sizes:
            for spec in chosen:
                repeats = args.repeats if size <= 64 else args.repeats_large
                log(f"--- {spec.key}: 1 x {size} workers, {repeats} times")
                case = bench.single(spec, size, repeats)
                result["single"].setdefault(spec.key, {})[str(size)] = case
        result["ratios_running"] = ratios(result["single"])
        result["meta"]["seconds"] = round(time.monotonic() - started, 1)
    finally:
        cosched.stop()
        volcano.stop()
        bench.cluster_down()
    out = Path(args.out) / "gangs.json"
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    log(f"wrote {out}")
    for key, case in result["single"].items():
        for size, one in case.items():
            running = one.get("running", {}).get("median")
            log(f"{key:14s} 1x{size:>4s}: create -> Running median {running}s")
    log(f"ratios (ours / mpi-operator, same gang scheduler): {result['ratios_running']}")


if __name__ == "__main__":
    main()
