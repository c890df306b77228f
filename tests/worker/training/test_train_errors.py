"""Bad input under horovodrun: every rank exits non-zero with one clear line, no hang."""

import subprocess
import sys
from pathlib import Path

import pytest

import horovod_contract as contract
from localcluster.paths import REPO
from tests.support.training import Run, horovodrun, worker_env

ERROR = "horovod_worker.train: error: "


def assert_every_rank_failed_with(run: Run, fragment: str, size: int = 2) -> None:
    assert run.returncode != 0, run.output[-3000:]
    for rank in range(size):
        errors = [line for line in run.rank_lines(rank) if line.startswith(ERROR)]
        assert len(errors) == 1, f"rank {rank}: {errors}\n{run.output[-3000:]}"
        assert fragment in errors[0], errors[0]
        assert not any("Traceback" in line for line in run.rank_lines(rank)), run.output[-3000:]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--framework=mxnet"], "invalid choice: 'mxnet'"),
        (["--batch-size=0"], "--batch-size: must be a positive integer, got 0"),
    ],
)
def test_bad_arguments(args: list[str], fragment: str) -> None:
    assert_every_rank_failed_with(horovodrun(args, timeout=120), fragment)


def test_missing_mnist_files(tmp_path: Path) -> None:
    run = horovodrun(["--dataset=mnist", f"--data-dir={tmp_path}"], timeout=120)
    assert_every_rank_failed_with(run, "MNIST files missing")


def test_unwritable_checkpoint_dir_stops_every_rank(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = horovodrun(["--epochs=1", f"--checkpoint-dir={blocker}/ckpt"], timeout=180)
    # Only rank 0 writes checkpoints, so only it can see the problem; the others
    # must stop with the same line instead of waiting in the next collective.
    assert_every_rank_failed_with(run, f"rank 0: checkpoint dir {blocker}/ckpt is not writable")


def test_size_mismatch_with_the_launcher_fails_loudly() -> None:
    run = horovodrun(["--epochs=1"], env={contract.ENV_EXPECTED_SIZE: "3"}, timeout=180)
    assert_every_rank_failed_with(run, f"hvd.size() is 2 but {contract.ENV_EXPECTED_SIZE}=3")


def test_a_process_alone_when_the_launcher_meant_two_fails() -> None:
    # What an MPI-built Horovod does without HOROVOD_CONTROLLER=gloo: size 1 each.
    done = subprocess.run(
        [sys.executable, "-m", "horovod_worker.train", "--epochs=1"],
        env=worker_env({contract.ENV_EXPECTED_SIZE: "2"}),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(ERROR)
    assert "hvd.size() is 1" in lines[-1] and "HOROVOD_CONTROLLER=gloo" in lines[-1]


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_gpus_asked_for_but_none_visible_fails_unless_cpu_is_allowed(framework: str) -> None:
    asked = {contract.ENV_GPUS_PER_WORKER: "1"}
    run = horovodrun([f"--framework={framework}", "--epochs=1"], env=asked, timeout=240)
    assert_every_rank_failed_with(run, "the pod asked for 1 GPU(s) (nvidia.com/gpu) but none")
    allowed = horovodrun(
        [f"--framework={framework}", "--epochs=1", "--allow-cpu"], env=asked, timeout=240
    )
    assert allowed.returncode == 0, allowed.output[-3000:]
