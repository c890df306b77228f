"""The GPU check's parts that run without a GPU: hack/gpu-check.sh's arguments,
and horovod_worker.gpu_check's arguments, numbers and summary (fed the files a
run leaves, good and bad). The check itself needs NVIDIA GPUs (docs/images.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from horovod_contract import result_line
from horovod_worker import gpu_check
from localcluster.paths import REPO

SCRIPT = REPO / "hack" / "gpu-check.sh"


def test_script_help_and_argument_errors() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    shown = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0
    for option in ("--out", "--python", "--bundle", "--np", "--cc", "bundle"):
        assert option in shown.stdout, option
    for args, message in (
        (["--bogus"], "unknown argument: --bogus"),
        (["--np", "0"], "--np '0' is not a positive number"),
        (["--cc", "sm_90"], "--cc 'sm_90' is not a list like 90 or 80,90"),
        (["--epochs", "x"], "--epochs 'x' is not a positive number"),
        (["--python", "/nonexistent/python3"], "no Python '/nonexistent/python3'"),
    ):
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 1, args
        assert message in done.stderr, (args, done.stderr)


def test_module_arguments() -> None:
    parser = gpu_check.build_parser()
    args = parser.parse_args(["probe", "--out", "/o", "--runs", "3"])
    assert (args.command, args.out, args.runs, args.steps) == ("probe", Path("/o"), 3, 20)
    args = parser.parse_args(["summarize", "--out", "/o", "--gpus", "2"])
    assert (args.command, args.gpus) == ("summarize", 2)
    for bad in (["summarize", "--out", "/o", "--gpus", "0"], ["probe"], []):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_numbers() -> None:
    assert gpu_check.samples_per_sec(1000, [2.0, 1.0, 4.0]) == 500.0
    # 1 GB in 0.1 s over 4 ranks: algbw 10 GB/s, busbw 10 * 2 * 3 / 4.
    assert gpu_check.bus_bandwidth(10**9, 0.1, 4) == pytest.approx(15.0)
    with pytest.raises(ValueError):
        gpu_check.bus_bandwidth(10**9, 0.1, 1)
    timeline = (
        '[\n{"name": "NCCL_ALLREDUCE", "ph": "B"},\n{"ph": "E", "name":"MEMCPY_IN_FUSION_BUFFER"},'
    )
    assert gpu_check.timeline_activities(timeline) == {"NCCL_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER"}


def rank_probe(rank: int, **changes: Any) -> dict[str, Any]:
    found = {
        "rank": rank,
        "local_rank": rank,
        "device": f"cuda:{rank}",
        "current_device": rank,
        "gpu_name": "NVIDIA H200",
        "nccl_built": True,
        "model_devices": [f"cuda:{rank}"],
        "batch_device": f"cuda:{rank}",
        "allreduce_device": f"cuda:{rank}",
        "allreduce_correct": True,
        "samples_per_sec_plain": 1000.0,
        "samples_per_sec_horovod": 900.0,
    }
    found.update(changes)
    return found


def a_run(out: Path, gpus: int = 2, probes: list[dict[str, Any]] | None = None) -> Path:
    """The files a passing run leaves in its output folder."""
    out.mkdir(exist_ok=True)
    (out / gpu_check.BUILD_FILE).write_text(json.dumps({"rc": 0, "seconds": 95, "cc_list": "90"}))
    result = {
        "size": gpus,
        "devices": [f"gpu:{i} (NVIDIA H200)" for i in range(gpus)],
        "local_ranks": list(range(gpus)),
        "param_checksums": ["abc"] * gpus,
        "test_accuracy": 0.95,
        "samples_per_sec": 12345.0,
    }
    (out / gpu_check.TRAINER_LOG).write_text(f"[1,0]<stdout>:{result_line(result)}\n")
    timeline = '[\n{"name": "NCCL_ALLREDUCE", "ph": "B", "ts": 1},\n'
    (out / gpu_check.TRAINER_TIMELINE).write_text(timeline)
    (out / gpu_check.PROBE_TIMELINE).write_text(timeline)
    report = {
        "ranks": probes if probes is not None else [rank_probe(i) for i in range(gpus)],
        "busbw_gb_per_s": 300.0 if gpus > 1 else None,
        "allreduce_mib": 256,
    }
    (out / gpu_check.PROBE_FILE).write_text(json.dumps(report))
    return out


def test_summary_of_a_passing_run(tmp_path: Path) -> None:
    out = a_run(tmp_path / "out")
    summary = gpu_check.summarize(out, 2)
    assert summary["failures"] == [] and summary["ok"] is True
    assert summary["trainer"]["pinned_to_local_rank"] is True
    assert summary["trainer"]["nccl_allreduce"] is True
    probe = summary["probe"]
    assert probe["wrapper_overhead"] == pytest.approx(0.1)
    assert probe["scaling_efficiency"] == pytest.approx(0.9)
    assert probe["busbw_gb_per_s"] == 300.0
    line = gpu_check.write_summary(summary, out)
    assert "\n" not in line and json.loads(line) == summary
    assert json.loads((out / gpu_check.SUMMARY_FILE).read_text()) == summary


def test_one_gpu_has_no_scaling_numbers(tmp_path: Path) -> None:
    summary = gpu_check.summarize(a_run(tmp_path / "out", gpus=1), 1)
    assert summary["ok"] is True
    assert "scaling_efficiency" not in summary["probe"]
    assert summary["probe"]["busbw_gb_per_s"] is None


def test_one_gpus_trainer_needs_no_nccl_allreduce_but_its_probe_does(tmp_path: Path) -> None:
    # As on the H200 (2026-12-04): Horovod's optimizer hooks nothing in a world of one.
    out = a_run(tmp_path / "out", gpus=1)
    (out / gpu_check.TRAINER_TIMELINE).write_text("[")
    summary = gpu_check.summarize(out, 1)
    assert summary["ok"] is True and summary["trainer"]["nccl_allreduce"] is False
    (out / gpu_check.PROBE_TIMELINE).write_text("[")
    failures = gpu_check.summarize(out, 1)["failures"]
    assert failures == ["no NCCL_ALLREDUCE in the probe's Horovod timeline"]


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        ([rank_probe(0), rank_probe(1, device="cuda:0")], "rank 1: device check failed (cuda:1)"),
        ([rank_probe(0), rank_probe(1, model_devices=["cpu"])], "rank 1: model_device check"),
        ([rank_probe(0, allreduce_correct=False), rank_probe(1)], "rank 0: allreduce_value"),
        ([rank_probe(0, nccl_built=False), rank_probe(1)], "built without NCCL"),
        ([rank_probe(0)], "1 probe ranks reported, 2 started"),
    ],
)
def test_probe_failures_fail_the_check(
    tmp_path: Path, probes: list[dict[str, Any]], expected: str
) -> None:
    summary = gpu_check.summarize(a_run(tmp_path / "out", probes=probes), 2)
    assert summary["ok"] is False
    assert any(expected in failure for failure in summary["failures"]), summary["failures"]


def test_missing_or_failed_steps_fail_the_check(tmp_path: Path) -> None:
    out = a_run(tmp_path / "out")
    (out / gpu_check.TRAINER_TIMELINE).write_text('[{"name": "ALLREDUCE"}')  # Gloo, not NCCL
    (out / gpu_check.BUILD_FILE).write_text(json.dumps({"rc": 2, "seconds": 3}))
    (out / gpu_check.PROBE_FILE).unlink()
    failures = gpu_check.summarize(out, 2)["failures"]
    assert "the Horovod build failed (exit 2; see build.log)" in failures
    assert "no NCCL_ALLREDUCE in the trainer's Horovod timeline" in failures
    assert "no probe.json (the probe did not finish; see probe.log)" in failures
    empty = gpu_check.summarize(tmp_path / "nothing", 2)
    assert empty["ok"] is False and len(empty["failures"]) >= 4


def test_the_trainer_off_its_gpu_fails_the_check(tmp_path: Path) -> None:
    out = a_run(tmp_path / "out")
    result = {"devices": ["gpu:0", "gpu:0"], "local_ranks": [0, 1], "param_checksums": ["a", "b"]}
    (out / gpu_check.TRAINER_LOG).write_text(result_line(result) + "\n")
    failures = gpu_check.summarize(out, 2)["failures"]
    assert any("not on gpu:<local_rank>" in f for f in failures), failures
    assert any("different parameters" in f for f in failures), failures


def summarize_command(out: Path, gpus: int) -> subprocess.CompletedProcess[str]:
    command = [
        "-m",
        "horovod_worker.gpu_check",
        "summarize",
        "--out",
        str(out),
        "--gpus",
        str(gpus),
    ]
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{REPO / 'worker'}:{REPO / 'contract'}", "PATH": "/usr/bin:/bin"},
    )


def test_summarize_prints_one_line_and_exits_by_the_verdict(tmp_path: Path) -> None:
    out = a_run(tmp_path / "out")
    done = summarize_command(out, 2)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["ok"] is True
    failed = summarize_command(out, 4)
    assert failed.returncode == 1 and json.loads(failed.stdout)["ok"] is False
