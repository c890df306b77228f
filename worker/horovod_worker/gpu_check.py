"""The GPU check's Python half (hack/gpu-check.sh runs it on a machine with GPUs).

``python -m horovod_worker.gpu_check probe --out DIR`` runs under
``horovodrun -np N``: every rank pins its device the way the trainer does
(``select_device`` and ``torch_trainer.pin_device``), checks that it is
``cuda:<local_rank>`` and that the trainer's model and a batch live there,
allreduces a CUDA tensor (Horovod's NCCL path when it was built with NCCL),
times training steps with and without Horovod's DistributedOptimizer (median of
several runs) and, with two or more GPUs, the allreduce bus bandwidth. Rank 0
writes every rank's findings to DIR/probe.json.

``python -m horovod_worker.gpu_check summarize --out DIR`` reads what the
script left in DIR (build.json, the trainer's log, the Horovod timelines,
probe.json), decides whether the check passed, writes DIR/summary.json and
prints it as one JSON line. Exit status 0 when it passed, 1 when not.

Only ``probe`` imports torch and Horovod; ``summarize`` is standard library and
numbers, so that it runs (and is tested) anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from horovod_worker.arguments import positive_int
from horovod_worker.common import parse_result

PROBE_FILE = "probe.json"
BUILD_FILE = "build.json"
SUMMARY_FILE = "summary.json"
TRAINER_LOG = "trainer.log"
TRAINER_TIMELINE = "trainer-timeline.json"
PROBE_TIMELINE = "probe-timeline.json"
# Horovod's timeline names the operation that moved a tensor; NCCL's allreduce is this.
NCCL_ALLREDUCE = "NCCL_ALLREDUCE"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovod_worker.gpu_check",
        description="The GPU check of hack/gpu-check.sh: a per-rank probe run under "
        "horovodrun, and the summary of everything the check found.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("probe", help="run under horovodrun -np N: one rank's checks")
    probe.add_argument("--out", type=Path, required=True, help="where rank 0 writes probe.json")
    probe.add_argument("--batch-size", type=positive_int, default=256, help="samples per step")
    probe.add_argument("--hidden", type=positive_int, default=4096, help="hidden units")
    probe.add_argument("--steps", type=positive_int, default=20, help="steps per timed run")
    probe.add_argument("--runs", type=positive_int, default=5, help="timed runs (median)")
    probe.add_argument(
        "--allreduce-mib", type=positive_int, default=256, help="bus bandwidth tensor (MiB)"
    )
    summarize = commands.add_parser("summarize", help="one JSON line from what the check left")
    summarize.add_argument("--out", type=Path, required=True, help="the check's output folder")
    summarize.add_argument("--gpus", type=positive_int, required=True, help="ranks started")
    return parser


# ---- numbers -------------------------------------------------------------------


def samples_per_sec(samples: int, seconds: Sequence[float]) -> float:
    """Throughput of the median run."""
    return samples / statistics.median(seconds)


def bus_bandwidth(nbytes: int, seconds: float, size: int) -> float:
    """NCCL's allreduce bus bandwidth in GB/s: algbw * 2(n-1)/n (nccl-tests' definition)."""
    if size < 2 or seconds <= 0:
        raise ValueError("bus bandwidth needs two or more ranks and a positive time")
    return nbytes / seconds * 2 * (size - 1) / size / 1e9


def timeline_activities(text: str) -> set[str]:
    """The event names of a Horovod timeline (Chrome trace JSON, possibly unterminated)."""
    return set(re.findall(r'"name"\s*:\s*"([^"]+)"', text))


# ---- summary -------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def trainer_findings(log: str, gpus: int) -> tuple[dict[str, Any], list[str]]:
    """What the trainer's result line says about devices, pinning and accuracy."""
    failures: list[str] = []
    try:
        result = parse_result(log)
    except ValueError:
        return {"result": None}, ["the trainer printed no HVJOB_RESULT line (see trainer.log)"]
    devices = [str(d) for d in result.get("devices", [])]
    local_ranks = [int(r) for r in result.get("local_ranks", [])]
    pinned = len(devices) == gpus == len(local_ranks) and all(
        device.split(" ")[0] == f"gpu:{local}"
        for device, local in zip(devices, local_ranks, strict=True)
    )
    if not pinned:
        failures.append(f"trainer ranks are not on gpu:<local_rank>: {devices} {local_ranks}")
    checksums = result.get("param_checksums", [])
    if len(set(checksums)) != 1:
        failures.append(f"trainer ranks ended with different parameters: {checksums}")
    findings = {
        "size": result.get("size"),
        "devices": devices,
        "local_ranks": local_ranks,
        "pinned_to_local_rank": pinned,
        "test_accuracy": result.get("test_accuracy"),
        "samples_per_sec": result.get("samples_per_sec"),
        "identical_parameters": len(set(checksums)) == 1,
    }
    return findings, failures


def probe_findings(probe: Any, gpus: int) -> tuple[dict[str, Any], list[str]]:
    """Every rank's probe, reduced to what the summary reports."""
    if not isinstance(probe, dict) or not isinstance(probe.get("ranks"), list):
        return {}, ["no probe.json (the probe did not finish; see probe.log)"]
    ranks: list[dict[str, Any]] = probe["ranks"]
    failures: list[str] = []
    if len(ranks) != gpus:
        failures.append(f"{len(ranks)} probe ranks reported, {gpus} started")
    for rank in ranks:
        where = f"rank {rank.get('rank')}"
        expected = f"cuda:{rank.get('local_rank')}"
        checks = {
            "device": rank.get("device") == expected,
            "current_device": rank.get("current_device") == rank.get("local_rank"),
            "model_device": rank.get("model_devices") == [expected],
            "batch_device": rank.get("batch_device") == expected,
            "allreduce_device": rank.get("allreduce_device") == expected,
            "allreduce_value": rank.get("allreduce_correct") is True,
        }
        failures += [
            f"{where}: {name} check failed ({expected})" for name, ok in checks.items() if not ok
        ]
    plain = [r["samples_per_sec_plain"] for r in ranks if "samples_per_sec_plain" in r]
    wrapped = [r["samples_per_sec_horovod"] for r in ranks if "samples_per_sec_horovod" in r]
    findings: dict[str, Any] = {
        "gpu_names": [r.get("gpu_name") for r in ranks],
        "nccl_built": all(r.get("nccl_built") for r in ranks) if ranks else False,
        "samples_per_sec_per_gpu_plain": statistics.median(plain) if plain else None,
        "samples_per_sec_per_gpu_horovod": statistics.median(wrapped) if wrapped else None,
        "busbw_gb_per_s": probe.get("busbw_gb_per_s"),
        "allreduce_mib": probe.get("allreduce_mib"),
    }
    if plain and wrapped:
        findings["wrapper_overhead"] = 1 - statistics.median(wrapped) / statistics.median(plain)
        if len(ranks) >= 2:
            # N GPUs with Horovod against N times one GPU alone (the unwrapped step).
            findings["scaling_efficiency"] = sum(wrapped) / (len(ranks) * statistics.median(plain))
    if not findings["nccl_built"]:
        failures.append("horovod.torch.nccl_built() is false: Horovod was built without NCCL")
    return findings, failures


def summarize(out: Path, gpus: int) -> dict[str, Any]:
    """Everything the check found in `out`, with `ok` and the reasons when it is false."""
    failures: list[str] = []
    build = _read_json(out / BUILD_FILE)
    if not isinstance(build, dict):
        build = {}
        failures.append("no build.json (the build did not finish; see build.log)")
    elif build.get("rc") != 0:
        failures.append(f"the Horovod build failed (exit {build.get('rc')}; see build.log)")
    trainer, trainer_failures = trainer_findings(_read_text(out / TRAINER_LOG), gpus)
    failures += trainer_failures
    trainer["nccl_allreduce"] = NCCL_ALLREDUCE in timeline_activities(
        _read_text(out / TRAINER_TIMELINE)
    )
    # Horovod's DistributedOptimizer registers no allreduce hooks in a world of one
    # (horovod/torch/optimizer.py): with one GPU the probe's allreduce is the proof.
    if not trainer["nccl_allreduce"] and gpus > 1:
        failures.append(f"no {NCCL_ALLREDUCE} in the trainer's Horovod timeline")
    probe, probe_failures = probe_findings(_read_json(out / PROBE_FILE), gpus)
    failures += probe_failures
    probe["nccl_allreduce"] = NCCL_ALLREDUCE in timeline_activities(
        _read_text(out / PROBE_TIMELINE)
    )
    if not probe["nccl_allreduce"]:
        failures.append(f"no {NCCL_ALLREDUCE} in the probe's Horovod timeline")
    return {
        "check": "horovod-gpu",
        "ok": not failures,
        "gpus": gpus,
        "build": build,
        "trainer": trainer,
        "probe": probe,
        "failures": failures,
    }


def write_summary(summary: Mapping[str, Any], out: Path) -> str:
    """Write summary.json; return the one line to print."""
    line = json.dumps(summary, sort_keys=True)
    (out / SUMMARY_FILE).write_text(line + "\n")
    return line


# ---- the probe (torch and Horovod) -----------------------------------------------


def _timed_runs(
    step: Callable[[], None], steps: int, runs: int, sync: Callable[[], None]
) -> list[float]:
    for _ in range(3):  # warm-up: cuDNN/cuBLAS choices, NCCL communicators
        step()
    sync()
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        seconds.append(time.perf_counter() - started)
    return seconds


def probe(args: argparse.Namespace) -> int:  # pragma: no cover - needs GPUs
    import horovod.torch as hvd
    import torch
    from torch import nn

    from horovod_worker import torch_trainer
    from horovod_worker.data import make_synthetic
    from horovod_worker.devices import select_device

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    choice = select_device(local_rank, hvd.local_size(), torch_trainer.visible_gpus())
    device = torch_trainer.pin_device(choice)
    found: dict[str, Any] = {
        "rank": rank,
        "local_rank": local_rank,
        "device": str(device),
        "current_device": torch.cuda.current_device() if torch.cuda.is_available() else None,
        "gpu_name": choice.name,
        "nccl_built": bool(hvd.nccl_built()),
    }
    dataset = make_synthetic(args.batch_size * 4)
    model = torch_trainer.build_model(dataset, args.hidden).to(device)
    found["model_devices"] = sorted({str(p.device) for p in model.parameters()})
    images = torch_trainer.to_nchw(dataset.x_train[: args.batch_size]).to(device)
    labels = torch.from_numpy(dataset.y_train[: args.batch_size]).to(device)
    found["batch_device"] = str(images.device)

    tensor = torch.full((1024,), float(rank + 1), device=device)
    reduced = hvd.allreduce(tensor, op=hvd.Sum, name="gpu_check.allreduce")
    found["allreduce_device"] = str(reduced.device)
    found["allreduce_correct"] = bool(torch.all(reduced == size * (size + 1) / 2).item())

    def sync() -> None:
        torch.cuda.synchronize(device)

    def train_step(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()

        return step

    plain = torch.optim.SGD(model.parameters(), lr=0.01)
    seconds = _timed_runs(train_step(plain), args.steps, args.runs, sync)
    found["samples_per_sec_plain"] = samples_per_sec(args.batch_size * args.steps, seconds)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    wrapped = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    seconds = _timed_runs(train_step(wrapped), args.steps, args.runs, sync)
    found["samples_per_sec_horovod"] = samples_per_sec(args.batch_size * args.steps, seconds)

    busbw = None
    if size >= 2:
        nbytes = args.allreduce_mib * 2**20
        big = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        times = _timed_runs(
            lambda: hvd.allreduce_(big, op=hvd.Sum, name="gpu_check.busbw"), 1, 10, sync
        )
        busbw = bus_bandwidth(nbytes, statistics.median(times), size)
    ranks = hvd.allgather_object(found, name="gpu_check.ranks")
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"ranks": ranks, "busbw_gb_per_s": busbw, "allreduce_mib": args.allreduce_mib}
        (args.out / PROBE_FILE).write_text(json.dumps(report, indent=1, sort_keys=True))
        print(f"gpu_check probe: {json.dumps(report, sort_keys=True)}", flush=True)
    hvd.join()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "probe":
        return probe(args)
    summary = summarize(args.out, args.gpus)
    print(write_summary(summary, args.out), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
