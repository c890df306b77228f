"""Elastic training for real: Horovod's elastic driver (elastic_launcher), the workers'
agents (elastic_agent) and the trainers under hvd.elastic.run, as local processes.

The PyTorch trainer losing and gaining workers is run whole, with the operator,
at the e2e rung (tests/e2e/test_elastic.py); here: the TensorFlow trainer losing
a worker, and an elastic run stopped as a suspension stops it (SIGTERM to every
process at once), whose checkpoint a resumed run continues from, at another size.
"""

from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path

from horovod_worker.common import parse_result
from horovod_worker.data import load
from localcluster.poll import wait_for
from tests.support.elastic import LocalElasticJob
from tests.support.prerequisites import require_module

torch = require_module("torch")

ACCURACY_BAR = 0.9


def trainer(framework: str, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "horovod_worker.train", f"--framework={framework}",
        "--dataset=digits", "--threads=1", *args,
    ]  # fmt: skip


def rank0(job: LocalElasticJob, workers: int, text: str) -> str | None:
    """The worker rank 0 trains in, once its log holds `text`: the driver orders
    hosts by worker index as it finds them, and an agent up late joins last."""
    for index in range(workers):
        log = job.log(f"worker-{index}")
        if "HVJOB_RANK rank=0 " in log and text in log:
            return f"worker-{index}"
    return None


def test_tensorflow_loses_a_worker_and_finishes_with_the_others(tmp_path: Path) -> None:
    """The ranks never look at the SIGTERM flag together here (HVJOB_STOP_CHECK_EVERY
    past the run's steps): the driver drops the leaving host first, and the next
    commit raises HostsUpdatedInterrupt on every rank. CI met that order by chance
    (the leaving rank reset, and Horovod ended it with std::terminate); here it is
    the only one, and the leaving rank must still go with 143 (commit_or_leave)."""
    job = LocalElasticJob(
        tmp_path,
        trainer("tensorflow", "--epochs=25"),
        workers=3,
        env={"HVJOB_COMMIT_EVERY": "10", "HVJOB_STOP_CHECK_EVERY": "1000000"},
    )
    try:
        for index in range(3):
            job.start_worker(index)
        job.start_launcher(np=3)
        first = wait_for(lambda: rank0(job, 3, " epoch 3/25 "), 300, 0.5, "the third epoch")
        leaving = max(i for i in range(3) if f"worker-{i}" != first)
        job.terminate(leaving)
        assert job.wait(timeout=400) == 0, job.log("launcher")
    finally:
        job.stop()
    launcher = job.log("launcher")
    assert "training at 3 rank(s)" in launcher and "training at 2 rank(s)" in launcher, launcher
    # The leaving rank left on its own terms, not from a reset it had no place in.
    left = job.log(f"worker-{leaving}")
    assert "SIGTERM: leaving at step" in left, left[-3000:]
    assert "has been removed from elastic job" not in left, left[-3000:]
    last = rank0(job, 3, "HVJOB_RESULT")
    assert last is not None, launcher
    summary = parse_result(job.log(last))
    assert summary["framework"] == "tensorflow" and summary["mode"] == "elastic"
    assert summary["elastic"]["sizes"] == [3, 2], summary["elastic"]
    assert summary["test_accuracy"] >= ACCURACY_BAR, summary
    assert len(set(summary["param_checksums"])) == 1, summary["param_checksums"]


def test_an_elastic_run_stopped_everywhere_checkpoints_and_resumes_at_another_size(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "ckpt"
    args = ("--epochs=12", f"--checkpoint-dir={checkpoints}", "--resume")
    env = {"HVJOB_COMMIT_EVERY": "10", "HVJOB_STOP_CHECK_EVERY": "3"}
    first = tmp_path / "first"
    first.mkdir()
    job = LocalElasticJob(first, trainer("pytorch", *args), workers=2, env=env)
    try:
        for index in range(2):
            job.start_worker(index)
        job.start_launcher(np=2)
        at_rank0 = wait_for(lambda: rank0(job, 2, " epoch 2/12 "), 300, 0.3, "the second epoch")
        time.sleep(0.3)  # into the third epoch: the checkpoint is mid-epoch
        # A suspension: every pod gets SIGTERM at about the same moment.
        assert job.launcher is not None
        job.launcher.terminate()
        for index in range(2):
            job.terminate(index)
        assert job.wait(timeout=120) == 143, job.log("launcher")
    finally:
        job.stop()
    stopping = r"every rank got SIGTERM at step (\d+); checkpoint (\S+)"
    stopped = re.search(stopping, job.log(at_rank0))
    assert stopped, job.log(at_rank0)[-3000:]
    step, path = int(stopped.group(1)), Path(stopped.group(2))
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == step and saved["processed"] > 0, {
        k: saved[k] for k in ("epoch", "step")
    }

    # Resumed with three workers: the same epoch, the samples after the checkpoint.
    second = tmp_path / "second"
    second.mkdir()
    job = LocalElasticJob(second, trainer("pytorch", *args), workers=3, env=env)
    try:
        for index in range(3):
            job.start_worker(index)
        job.start_launcher(np=3)
        assert job.wait(timeout=400) == 0, job.log("launcher")
    finally:
        job.stop()
    resumed = rank0(job, 3, "HVJOB_RESULT")
    assert resumed is not None, job.log("launcher")
    log0 = job.log(resumed)
    point = f"(epoch {saved['epoch']}, step {step}, {saved['processed']} samples)"
    assert f"resumed from {path} {point}" in log0, log0[-3000:]
    summary = parse_result(log0)
    # The step counter went on from the checkpoint: its step, plus the rest of that
    # epoch and the epochs after it at 3 ranks (ElasticSampler's arithmetic: each
    # rank takes ceil(samples left / 3), in batches of 32).
    samples = len(load("digits", None, 0).y_train)

    def batches(left: int) -> int:
        return math.ceil(math.ceil(left / 3) / 32)

    rest = batches(samples - saved["processed"]) + (12 - saved["epoch"] - 1) * batches(samples)
    assert summary["steps"] == step + rest, (summary["steps"], step, rest)
    assert summary["start_epoch"] == saved["epoch"], summary
    assert summary["elastic"]["sizes"] == [3] and summary["test_accuracy"] >= ACCURACY_BAR
