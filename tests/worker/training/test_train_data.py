"""--dataset imagefolder and csv: files on disk (as on a mounted volume), read by
every rank, each training on its own shard, under horovodrun (Gloo, 2 CPU ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.datasets import write_csv, write_image_folder
from tests.support.training import horovodrun


def _check_sharded_run(result: dict[str, object], dataset: str) -> None:
    assert result["dataset"] == dataset and result["size"] == 2
    checksums = result["param_checksums"]
    assert isinstance(checksums, list) and len(set(checksums)) == 1, checksums
    orders = result["epoch_orders"]
    assert isinstance(orders, list)
    # Each rank visited a different shard in every epoch.
    assert all(a != b for a, b in zip(orders[0], orders[1], strict=True)), orders


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_image_folder_trains_sharded_on_two_ranks(tmp_path: Path, framework: str) -> None:
    write_image_folder(tmp_path / "data", per_class=40, side=12)
    run = horovodrun(
        [
            f"--framework={framework}",
            "--dataset=imagefolder",
            f"--data-dir={tmp_path / 'data'}",
            "--image-size=12",
            "--epochs=3",
            "--batch-size=8",
            f"--checkpoint-dir={tmp_path / 'ckpt'}",
        ],
        timeout=300,
    )
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    _check_sharded_run(result, "imagefolder")
    assert result["test_accuracy"] >= 0.9, result["history"]
    assert any((tmp_path / "ckpt").iterdir())


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_csv_trains_sharded_on_two_ranks(tmp_path: Path, framework: str) -> None:
    write_csv(tmp_path / "data" / "train.csv", rows=400)
    write_csv(tmp_path / "data" / "test.csv", rows=100, seed=6)
    run = horovodrun(
        [
            f"--framework={framework}",
            "--dataset=csv",
            f"--data-dir={tmp_path / 'data'}",
            "--epochs=4",
            "--batch-size=16",
        ],
        timeout=300,
    )
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    _check_sharded_run(result, "csv")
    assert result["test_accuracy"] >= 0.85, result["history"]


def test_a_missing_data_dir_fails_every_rank_with_one_line(tmp_path: Path) -> None:
    run = horovodrun(["--dataset=imagefolder", f"--data-dir={tmp_path / 'missing'}"], timeout=120)
    assert run.returncode != 0
    assert "does not exist" in run.output
