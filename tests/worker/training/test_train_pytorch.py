"""PyTorch + Horovod with real horovodrun processes (Gloo, and MPI when built)."""

import shutil
from pathlib import Path
from typing import Any

import pytest

import horovod_contract as contract
from tests.support.prerequisites import skip_unless_ci
from tests.support.training import Run, built_with, horovodrun

EPOCHS = 3
COMMON = ["--framework=pytorch", "--dataset=digits", "--batch-size=32", "--lr=0.05"]


def assert_trained_together(run: Run, result: dict[str, Any], size: int = 2) -> None:
    assert run.returncode == 0, run.output[-4000:]
    assert result["size"] == size
    history = result["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]  # loss falls
    assert result["test_accuracy"] >= 0.90
    # Bit-identical parameters on every rank (checksums allgathered by the trainer).
    assert len(result["param_checksums"]) == size
    assert len(set(result["param_checksums"])) == 1, result["param_checksums"]
    assert result["local_ranks"] == list(range(size))
    assert len(result["hostnames"]) == size
    for rank in range(size):
        starts = [line for line in run.rank_lines(rank) if line.startswith(contract.RANK_PREFIX)]
        assert len(starts) == 1, run.output[-3000:]
        assert f"rank={rank} " in starts[0] and f"local_rank={rank} " in starts[0]
        assert "device=cpu" in starts[0]
    # Progress and the result line come from rank 0 only.
    assert not any(contract.RESULT_PREFIX in line for line in run.rank_lines(1))
    progress = [line for line in run.rank_lines(0) if " epoch " in line and "samples/s=" in line]
    assert len(progress) == EPOCHS - result["start_epoch"]
    assert not any("samples/s=" in line for line in run.rank_lines(1))


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """Ranks start from different seeds and are given different output dirs."""
    out = tmp_path_factory.mktemp("pytorch-gloo")
    run = horovodrun(
        [
            *COMMON,
            f"--epochs={EPOCHS}",
            "--seed=1{rank}",
            f"--checkpoint-dir={out}/ckpt-{{rank}}",
            f"--log-dir={out}/logs-{{rank}}",
        ],
        per_rank=True,
    )
    return run, out


def test_two_gloo_ranks_learn_digits_and_end_identical(gloo_run: tuple[Run, Path]) -> None:
    run, _ = gloo_run
    assert_trained_together(run, run.result())


def test_broadcast_makes_ranks_started_from_different_seeds_identical(
    gloo_run: tuple[Run, Path],
) -> None:
    result = gloo_run[0].result()
    initial = result["initial_checksums"]
    assert initial[0] != initial[1]  # the seeds did differ before the broadcast
    # Equal before the first step, as rank 0 started: the broadcast came first. (Equal
    # final weights alone would also pass with the broadcast after training.)
    assert result["start_checksums"] == [initial[0], initial[0]], result["start_checksums"]
    assert len(set(result["param_checksums"])) == 1


def test_every_epoch_reshuffles_and_ranks_see_different_shards(
    gloo_run: tuple[Run, Path],
) -> None:
    orders = gloo_run[0].result()["epoch_orders"]
    for rank, per_epoch in enumerate(orders):
        # Without sampler.set_epoch every epoch repeats the first one's order.
        assert len(set(per_epoch)) == EPOCHS, (rank, per_epoch)
    assert not set(orders[0]) & set(orders[1]), orders


def test_only_rank_0_writes_checkpoints_and_logs(gloo_run: tuple[Run, Path]) -> None:
    _, out = gloo_run
    assert sorted(p.name for p in (out / "ckpt-0").iterdir()) == [
        f"checkpoint-{epoch:04d}.pt" for epoch in range(1, EPOCHS + 1)
    ]
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "logs-0").iterdir())
    assert not (out / "ckpt-1").exists()
    assert not (out / "logs-1").exists()


def test_resume_equals_the_uninterrupted_run(gloo_run: tuple[Run, Path], tmp_path: Path) -> None:
    uninterrupted = gloo_run[0].result()
    args = [*COMMON, "--seed=1{rank}", f"--checkpoint-dir={tmp_path}/ckpt"]
    first = horovodrun([*args, "--epochs=1"], per_rank=True)
    assert first.returncode == 0, first.output[-3000:]
    resumed_run = horovodrun([*args, f"--epochs={EPOCHS}", "--resume"], per_rank=True)
    resumed = resumed_run.result()
    assert_trained_together(resumed_run, resumed)
    assert resumed["start_epoch"] == 1
    assert resumed["resumed_from"].endswith("checkpoint-0001.pt")
    assert resumed["final_loss"] == pytest.approx(uninterrupted["final_loss"], rel=1e-6)
    assert resumed["test_accuracy"] == pytest.approx(uninterrupted["test_accuracy"])
    assert resumed["param_sq_norm"] == pytest.approx(uninterrupted["param_sq_norm"], rel=1e-6)


def test_mpi_launch(tmp_path: Path) -> None:
    if shutil.which("mpirun") is None:
        skip_unless_ci("Open MPI not installed (apt-get install openmpi-bin libopenmpi-dev)")
    if not built_with("MPI"):
        skip_unless_ci("horovod was built without MPI (rerun hack/install-worker.sh)")
    run = horovodrun([*COMMON, f"--epochs={EPOCHS}"], mode="mpi")
    assert_trained_together(run, run.result())
