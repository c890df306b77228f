"""SIGTERM mid-training (what a suspend or an eviction sends): every rank stops at one
agreed step, rank 0 writes a checkpoint of it, and --resume continues from that step
to the same parameters as a run never interrupted (preemption.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from horovod_worker.preemption import EXIT_PREEMPTED
from tests.support.training import HOROVODRUN_COMMAND, horovodrun, worker_env

EPOCHS = 5
COMMON = ["--framework=pytorch", "--dataset=digits", "--batch-size=32", "--lr=0.05"]
STOPPED = re.compile(r"stopped on SIGTERM at epoch (\d+), step (\d+); (.*)")


def ranks_of(marker: str) -> list[int]:
    """Pids of the trainer processes whose command line holds `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        # The Python process itself, not horovodrun's shell around it.
        if argv[:3] == [sys.executable, "-m", "horovod_worker.train"] and marker in " ".join(argv):
            pids.append(int(entry.name))
    return pids


def stopped_after_the_first_epoch(args: list[str], marker: str) -> tuple[str, int, int]:
    """Run two ranks; after the first epoch send each rank process SIGTERM, as the
    kubelet would. Returns (output, ranks signalled, horovodrun's exit code)."""
    command = [*HOROVODRUN_COMMAND, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m",
               "horovod_worker.train", *args]  # fmt: skip
    env = worker_env({"HVJOB_STOP_CHECK_EVERY": "1"})
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    signalled: list[int] = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        lines.append(line)
        if not signalled and f" epoch 1/{EPOCHS} " in line:
            signalled = ranks_of(marker)
            for pid in signalled:
                os.kill(pid, signal.SIGTERM)
        assert time.monotonic() < deadline, "".join(lines[-40:])
    proc.wait(timeout=60)
    return "".join(lines), len(signalled), proc.returncode


def agreed_stop(output: str) -> tuple[int, int]:
    """(epoch, step) at which both ranks stopped, the same on both."""
    stops = [m.groups() for m in STOPPED.finditer(output)]
    assert len(stops) == 2, output[-3000:]
    assert len({(epoch, step) for epoch, step, _ in stops}) == 1, stops
    return int(stops[0][0]), int(stops[0][1])


def test_sigterm_stops_every_rank_at_one_step_and_resume_continues_from_it(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "ckpt"
    args = [*COMMON, f"--epochs={EPOCHS}", f"--checkpoint-dir={checkpoints}"]
    output, signalled, code = stopped_after_the_first_epoch(args, str(checkpoints))
    assert signalled == 2 and code != 0, output[-3000:]
    # Both ranks stopped, at the same epoch and step, after the first epoch.
    epoch, step = agreed_stop(output)
    assert epoch == 2 and step > 0
    saved = {p.name for p in checkpoints.glob("checkpoint-*.pt")}
    # The epoch-1 checkpoint and the preemption's, within epoch 2 (batches done).
    [preempted] = [name for name in saved if re.fullmatch(r"checkpoint-0001-\d{6}\.pt", name)]
    assert saved == {"checkpoint-0001.pt", preempted}, saved
    assert f"Exit code: {EXIT_PREEMPTED}" in output, output[-2000:]

    resumed_run = horovodrun([*args, "--resume"])
    assert resumed_run.returncode == 0, resumed_run.output[-3000:]
    resumed = resumed_run.result()
    assert resumed["resumed_from"].endswith(preempted), "the newest: the preemption's"
    # The step counter continues where the ranks stopped.
    assert f"(epoch 1, step {step})" in resumed_run.output, resumed_run.output[-3000:]

    uninterrupted = horovodrun([*args[:-1], f"--checkpoint-dir={tmp_path / 'other'}"]).result()
    assert resumed["param_sq_norm"] == pytest.approx(uninterrupted["param_sq_norm"], rel=1e-6)
    assert resumed["test_accuracy"] == pytest.approx(uninterrupted["test_accuracy"])


def test_tensorflow_tape_stops_at_one_step_with_a_checkpoint_and_resumes_within_the_epoch(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "tf-ckpt"
    args = ["--framework=tensorflow", "--dataset=digits", "--batch-size=32", "--lr=0.05",
            f"--epochs={EPOCHS}", f"--checkpoint-dir={checkpoints}"]  # fmt: skip
    output, signalled, code = stopped_after_the_first_epoch(args, str(checkpoints))
    assert signalled == 2 and code != 0, output[-3000:]
    epoch, step = agreed_stop(output)
    assert epoch == 2 and step > 0
    assert f"Exit code: {EXIT_PREEMPTED}" in output, output[-2000:]

    resumed_run = horovodrun([*args, "--resume"])
    assert resumed_run.returncode == 0, resumed_run.output[-3000:]
    # Epoch 1 done, the step where they stopped: the rest of epoch 2 follows.
    assert f"(epoch 1, step {step})" in resumed_run.output, resumed_run.output[-3000:]
    resumed = resumed_run.result()
    uninterrupted = horovodrun([*args[:-1], f"--checkpoint-dir={tmp_path / 'other'}"]).result()
    assert resumed["param_sq_norm"] == pytest.approx(uninterrupted["param_sq_norm"], rel=1e-6)
