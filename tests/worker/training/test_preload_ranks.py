"""Ranks started from horovod_worker.preload by our horovodrun, with real Horovod:
the same training as ranks that start their own interpreter (MPI and Gloo)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.prerequisites import skip_unless_ci
from tests.support.training import Run, built_with, worker_env

REPO = Path(__file__).resolve().parents[3]
PRELOADED = "torch,horovod.torch"


@pytest.fixture
def preloader(tmp_path: Path) -> Iterator[tuple[dict[str, str], subprocess.Popen[str]]]:
    env = worker_env(
        {
            "HVJOB_PRELOAD": PRELOADED,
            "HVJOB_PRELOAD_DIR": str(tmp_path / "socket"),
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_mpi_yield_when_idle": "1",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "horovod_worker.preload", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "imported in" in first, first + proc.stdout.read()
    yield env, proc
    proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("mode", ["mpi", "gloo"])
def test_ranks_from_the_preloader_train_as_fresh_ones_do(
    mode: str, preloader: tuple[dict[str, str], subprocess.Popen[str]]
) -> None:
    if mode == "mpi" and not built_with("MPI"):
        skip_unless_ci("Horovod here was built without MPI")
    env, proc = preloader
    command = [
        sys.executable, "-m", "horovod_worker.horovodrun", "-np", "2", "-H", "localhost:2",
        f"--{mode}", sys.executable, "-m", "horovod_worker.train",
        "--framework=pytorch", "--dataset=digits", "--epochs=2", "--batch-size=32",
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300, cwd=REPO,
    )  # fmt: skip
    run = Run(done.returncode, done.stdout)
    proc.kill()
    assert proc.stdout is not None
    served = proc.stdout.read()
    assert run.returncode == 0, run.output[-4000:] + served
    assert "not preloaded" not in run.output, run.output[-4000:]
    result = run.result()
    assert result["size"] == 2 and result["local_ranks"] == [0, 1]
    assert len(set(result["param_checksums"])) == 1
    assert result["history"][-1]["train_loss"] < result["history"][0]["train_loss"]
    # Both ranks were the preloader's children, and both ended well.
    started = [line for line in served.splitlines() if " runs " in line]
    ended = [line for line in served.splitlines() if "exited with 0" in line]
    assert len(started) == 2 and "horovod_worker.train" in started[0], served
    assert len(ended) == 2, served
