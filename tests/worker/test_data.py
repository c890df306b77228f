"""Datasets, sharding and the helpers shared by the trainers (no Horovod needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import horovod_contract as contract
from horovod_contract.rank_output import rank_lines, split_by_rank
from horovod_worker import data
from horovod_worker.common import (
    WorkerError,
    agree_on_error,
    checksum,
    ensure_writable_dir,
    learning_rate,
    parse_result,
    rank_line,
)
from horovod_worker.data import (
    CSV_LABEL,
    MNIST_FILES,
    DataError,
    eval_shard,
    load,
    make_synthetic,
    read_idx,
    write_idx,
)
from tests.support.datasets import CLASSES, write_csv, write_image_folder
from tests.support.prerequisites import require_module


def write_mnist(
    directory: Path, train: int = 12, test: int = 5, gz: bool = False
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    suffix = ".gz" if gz else ""
    parts = {
        "train_images": rng.integers(0, 256, (train, 28, 28)),
        "train_labels": rng.integers(0, 10, train),
        "test_images": rng.integers(0, 256, (test, 28, 28)),
        "test_labels": rng.integers(0, 10, test),
    }
    for part, array in parts.items():
        write_idx(directory / f"{MNIST_FILES[part]}{suffix}", array)
    return parts


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_files_are_read_and_scaled(tmp_path: Path, gz: bool) -> None:
    parts = write_mnist(tmp_path, gz=gz)
    data = load("mnist", tmp_path)
    assert data.x_train.shape == (12, 28, 28, 1) and data.x_test.shape == (5, 28, 28, 1)
    assert data.x_train.dtype == np.float32 and 0.0 <= data.x_train.min() <= data.x_train.max() <= 1
    np.testing.assert_array_equal(data.y_train, parts["train_labels"])
    np.testing.assert_allclose(data.x_test[..., 0] * 255, parts["test_images"], atol=1e-4)


def test_missing_mnist_dir_or_files_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load("mnist", tmp_path / "nowhere")
    with pytest.raises(DataError, match="nothing is downloaded") as raised:
        load("mnist", tmp_path)
    assert all(stem in str(raised.value) for stem in MNIST_FILES.values())
    with pytest.raises(DataError, match="needs --data-dir"):
        load("mnist", None)


def test_corrupt_idx_files_are_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(DataError, match="bad magic"):
        read_idx(bad)
    short = tmp_path / "short"
    write_idx(short, np.zeros((4, 2), dtype=np.uint8))
    short.write_bytes(short.read_bytes()[:-1])
    with pytest.raises(DataError, match="truncated"):
        read_idx(short)


def test_digits_is_real_bundled_data_with_a_fixed_split() -> None:
    require_module("sklearn")
    first, second = load("digits"), load("digits")
    assert first.x_train.shape[1:] == (8, 8, 1)
    assert len(first.y_train) + len(first.y_test) == 1797
    np.testing.assert_array_equal(first.y_test, second.y_test)
    assert set(np.unique(first.y_train)) == set(range(10))


def test_digits_read_without_sklearn_equal_sklearns_own_split() -> None:
    require_module("sklearn")
    ours, theirs = load("digits"), data.load_digits_with_sklearn()
    for part in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(ours, part), getattr(theirs, part), err_msg=part)
        assert getattr(ours, part).dtype == getattr(theirs, part).dtype, part
    # The recorded split is what scikit-learn makes today (else: hack/digits_split.py).
    assert json.loads(data.DIGITS_SPLIT.read_text()) == data.digits_split()


def test_digits_are_read_without_importing_sklearn() -> None:
    require_module("sklearn")
    probe = (
        "import sys; from horovod_worker.data import load; d = load('digits'); "
        "print(len(d.y_train), sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.split() == ["1437", "[]"], out


def test_digits_fall_back_to_sklearn_without_the_recorded_split(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_module("sklearn")
    monkeypatch.setattr(data, "DIGITS_SPLIT", tmp_path / "absent.json")
    fallback = load("digits")
    np.testing.assert_array_equal(fallback.y_test, data.load_digits_with_sklearn().y_test)


def test_synthetic_is_deterministic_and_has_every_class() -> None:
    data = make_synthetic(200)
    again = make_synthetic(200)
    np.testing.assert_array_equal(data.x_train, again.x_train)
    assert len(data.y_train) + len(data.y_test) == 200
    assert len(np.unique(data.y_train)) == 10
    with pytest.raises(DataError, match="at least"):
        make_synthetic(3)


@pytest.mark.parametrize(("n", "size"), [(10, 1), (10, 3), (360, 2), (2, 4)])
def test_eval_shards_are_disjoint_and_cover_the_set(n: int, size: int) -> None:
    parts = [np.arange(n)[eval_shard(n, rank, size)] for rank in range(size)]
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_torch_distributed_sampler_partitions_and_reshuffles_per_epoch() -> None:
    torch = require_module("torch")
    from torch.utils.data import DistributedSampler

    data = torch.utils.data.TensorDataset(torch.arange(101))
    samplers: list[DistributedSampler[Any]] = [
        DistributedSampler(data, num_replicas=2, rank=r, seed=7) for r in range(2)
    ]
    epochs = []
    for epoch in range(2):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        shards = [list(sampler) for sampler in samplers]
        assert len(shards[0]) == len(shards[1])  # same step count on every rank
        assert set(shards[0]) | set(shards[1]) == set(range(101))
        epochs.append(shards[0])
    assert epochs[0] != epochs[1]


def test_learning_rate_warms_up_linearly_to_size_times_base() -> None:
    assert learning_rate(0, 10, 0.1, 4, warmup_epochs=1) == pytest.approx(0.1)
    assert learning_rate(5, 10, 0.1, 4, warmup_epochs=1) == pytest.approx(0.25)
    assert learning_rate(10, 10, 0.1, 4, warmup_epochs=1) == pytest.approx(0.4)
    assert learning_rate(99, 10, 0.1, 4, warmup_epochs=1) == pytest.approx(0.4)
    assert learning_rate(0, 10, 0.1, 4, warmup_epochs=0) == pytest.approx(0.4)
    assert learning_rate(3, 10, 0.1, 1, warmup_epochs=2) == pytest.approx(0.1)


def test_checksum_sees_one_bit() -> None:
    weights = [np.ones((3, 3), dtype=np.float32), np.zeros(3, dtype=np.float32)]
    changed = [w.copy() for w in weights]
    changed[1][2] = np.nextafter(np.float32(0), np.float32(1))
    assert checksum(weights) == checksum([w.copy() for w in weights])
    assert checksum(weights) != checksum(changed)


def test_result_line_round_trips_through_horovodrun_prefixes() -> None:
    line = contract.result_line({"framework": "pytorch", "size": 2, "test_accuracy": 0.95})
    assert line.startswith(f"{contract.RESULT_PREFIX} {{")
    output = f"[1,0]<stdout>:epoch 1/1 loss=0.3\n[1,0]<stdout>:{line}\n"
    assert parse_result(output) == json.loads(line.split(" ", 1)[1])
    split = line[:40] + "[1,0]<stdout>:" + line[40:] + "[1,0]<stdout>:"
    assert parse_result(f"[1,0]<stdout>:{split}\n") == parse_result(output)
    with pytest.raises(ValueError, match="no HVJOB_RESULT"):
        parse_result("nothing here")


def test_rank_line_has_what_the_end_to_end_tests_grep_for() -> None:
    line = rank_line(1, 2, 0, 1, "job-worker-1", "gpu:0 (H100)")
    assert line.startswith(contract.RANK_PREFIX + " ")
    for field in ("rank=1", "size=2", "local_rank=0", "hostname=job-worker-1", "device=gpu:0"):
        assert field in line


def test_unwritable_dir_is_a_worker_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WorkerError, match=r"checkpoint dir .* is not writable"):
        ensure_writable_dir(blocker / "ckpt", "checkpoint dir")
    ensure_writable_dir(tmp_path / "new" / "dir", "log dir")
    assert (tmp_path / "new" / "dir").is_dir()


class FakeHorovod:
    """Stands for one rank of a 2-rank world whose allgather returns fixed values."""

    def __init__(self, gathered: list[str | None]) -> None:
        self.gathered = gathered
        self.names: list[str | None] = []

    def size(self) -> int:
        return len(self.gathered)

    def allgather_object(self, obj: object, name: str | None = None) -> list[str | None]:
        self.names.append(name)
        return self.gathered


def test_agree_on_error_stops_every_rank_with_the_first_error() -> None:
    hvd = FakeHorovod([None, "MNIST files missing in /data"])
    with pytest.raises(WorkerError, match=r"^rank 1: MNIST files missing in /data$"):
        agree_on_error(hvd, None)
    # Horovod matches collectives by name; the default (the object's type) would
    # differ between a rank with an error (str) and one without (NoneType): a hang.
    assert hvd.names == ["agree_on_error"]
    agree_on_error(FakeHorovod([None, None]), None)


def test_rank_lines_survive_open_mpi_cutting_lines_between_chunks() -> None:
    # As seen in CI: rank 0's start line ends in a later chunk, after rank 1's.
    output = (
        "WARNING: untagged launcher text\n"
        "[1,0]<stdout>:HVJOB_RANK rank=0 device=cpu[1,1]<stdout>:HVJOB_RANK rank=1 device=cpu"
        "[1,0]<stdout>:\n"
        "[1,0]<stdout>:epoch 1/1[1,1]<stdout>:\n"
        "[1,1]<stderr>:warn\n"
        "noise[1,0]<stdout>: done\n"
    )
    assert rank_lines(output, 0) == ["HVJOB_RANK rank=0 device=cpu", "epoch 1/1 done"]
    assert rank_lines(output, 1) == ["HVJOB_RANK rank=1 device=cpu", "warn"]
    untagged = [line for owner, line in split_by_rank(output) if owner is None]
    assert untagged == ["WARNING: untagged launcher text", "noise"]
    assert rank_lines("[0]<stdout>:gloo line\n[1]<stdout>:other\n", 0) == ["gloo line"]


def test_result_line_found_when_another_rank_cuts_it() -> None:
    line = contract.result_line({"framework": "pytorch", "size": 2})
    output = f"[1,0]<stdout>:{line[:30]}[1,1]<stdout>:rank 1 noise\n[1,0]<stdout>:{line[30:]}\n"
    assert parse_result(output) == {"framework": "pytorch", "size": 2}


def test_image_folder_reads_classes_from_subdirectories(tmp_path: Path) -> None:
    write_image_folder(tmp_path, per_class=6, side=10)
    data = load("imagefolder", tmp_path, image_size=8)
    assert data.num_classes == len(CLASSES)
    assert data.x_train.shape == (18, 8, 8, 3) and data.x_test.shape == (6, 8, 8, 3)
    assert data.x_train.dtype == np.float32 and 0.0 <= data.x_train.min() <= data.x_train.max() <= 1
    # Class = the brightest channel, read back through PNG and JPEG alike.
    brightest = data.x_train.mean(axis=(1, 2)).argmax(axis=1)
    assert (brightest == data.y_train).all()


def test_image_folder_without_test_dir_splits_off_a_fixed_fifth(tmp_path: Path) -> None:
    write_image_folder(tmp_path, per_class=10, side=6, test=False)
    first = load("imagefolder", tmp_path, image_size=6)
    second = load("imagefolder", tmp_path, image_size=6)
    assert (len(first.y_train), len(first.y_test)) == (24, 6)
    assert (first.y_test == second.y_test).all()


def test_image_folder_errors_name_the_path_and_layout(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load("imagefolder", tmp_path / "nope")
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no class subdirectories"):
        load("imagefolder", tmp_path)
    (tmp_path / "train" / "cat").mkdir()
    (tmp_path / "train" / "cat" / "x.png").write_bytes(b"not a png")
    (tmp_path / "train" / "cat" / "y.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"cannot read image .*x\.png"):
        load("imagefolder", tmp_path)


def test_csv_reads_features_and_label_column_and_standardizes(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", rows=50, features=4)
    data = load("csv", tmp_path)
    assert data.x_train.shape == (40, 1, 4, 1) and data.x_test.shape == (10, 1, 4, 1)
    assert data.num_classes == 3
    assert np.allclose(data.x_train.mean(axis=0), 0, atol=1e-5)
    assert np.allclose(data.x_train.std(axis=0), 1, atol=1e-4)


def test_csv_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"train\.csv does not exist"):
        load("csv", tmp_path)
    (tmp_path / "train.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=f"no '{CSV_LABEL}' column"):
        load("csv", tmp_path)
    (tmp_path / "train.csv").write_text("a,label\n1,x\n")
    with pytest.raises(DataError, match="must be a number"):
        load("csv", tmp_path)
    (tmp_path / "train.csv").write_text("a,label\n1,0.5\n")
    with pytest.raises(DataError, match="class indices"):
        load("csv", tmp_path)
