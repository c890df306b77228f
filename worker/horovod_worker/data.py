"""Datasets as numpy arrays, the same for both frameworks.

Three sources, none downloaded at run time (worker pods usually have no
internet, and a download race between ranks corrupts files):

- ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real
  images shipped inside the package), the default.
- ``mnist``: the four MNIST IDX files (optionally gzipped) in ``--data-dir``.
- ``synthetic``: random images with labels from a fixed random linear
  teacher, so that a model can learn them; for throughput runs.

The train/test split is fixed (not tied to ``--seed``) so that every rank
holds the same split whatever seed it was started with.
"""

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASETS = ("digits", "mnist", "synthetic")
NUM_CLASSES = 10
SPLIT_SEED = 0

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


class DataError(RuntimeError):
    """The dataset cannot be loaded; the message names what is missing or wrong."""


@dataclass(frozen=True)
class Dataset:
    """Images as float32 in [0, 1] with shape (n, height, width, 1); int64 labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int = NUM_CLASSES

    @property
    def image_shape(self) -> tuple[int, int, int]:
        shape = self.x_train.shape[1:]
        return (int(shape[0]), int(shape[1]), int(shape[2]))


def load(name: str, data_dir: Path | None = None, synthetic_samples: int = 4096) -> Dataset:
    """Load a dataset by name; raises DataError with a one-line reason."""
    if name == "digits":
        return load_digits()
    if name == "mnist":
        if data_dir is None:
            raise DataError("--dataset mnist needs --data-dir with the four MNIST IDX files")
        return load_mnist(data_dir)
    if name == "synthetic":
        return make_synthetic(synthetic_samples)
    raise DataError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)})")


def load_digits() -> Dataset:
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., np.newaxis]
    labels = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=SPLIT_SEED, stratify=labels
    )
    return Dataset("digits", x_train, y_train, x_test, y_test)


def mnist_paths(data_dir: Path) -> dict[str, Path]:
    """The IDX file for each part, plain or ``.gz``; DataError names the missing ones."""
    if not data_dir.is_dir():
        raise DataError(
            f"MNIST data dir {data_dir} does not exist (expected "
            f"{', '.join(MNIST_FILES.values())}, plain or .gz; nothing is downloaded)"
        )
    found: dict[str, Path] = {}
    missing: list[str] = []
    for part, stem in MNIST_FILES.items():
        for candidate in (data_dir / stem, data_dir / f"{stem}.gz"):
            if candidate.is_file():
                found[part] = candidate
                break
        else:
            missing.append(stem)
    if missing:
        raise DataError(
            f"MNIST files missing in {data_dir}: {', '.join(missing)} "
            "(plain or .gz; nothing is downloaded)"
        )
    return found


def load_mnist(data_dir: Path) -> Dataset:
    paths = mnist_paths(data_dir)
    x_train = read_idx(paths["train_images"])
    y_train = read_idx(paths["train_labels"])
    x_test = read_idx(paths["test_images"])
    y_test = read_idx(paths["test_labels"])
    for images, labels, part in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"MNIST {part} files in {data_dir} disagree: images {images.shape}, "
                f"labels {labels.shape}"
            )
    return Dataset(
        "mnist",
        (x_train.astype(np.float32) / 255.0)[..., np.newaxis],
        y_train.astype(np.int64),
        (x_test.astype(np.float32) / 255.0)[..., np.newaxis],
        y_test.astype(np.int64),
    )


def read_idx(path: Path) -> np.ndarray:
    """Read an unsigned-byte IDX file (the MNIST format), plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    dtype_code, ndim = raw[2], raw[3]
    if dtype_code != 0x08:
        raise DataError(f"{path}: only unsigned-byte IDX data is supported (type {dtype_code:#x})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated (header)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims)) if dims else 0
    if len(raw) - header != expected:
        raise DataError(f"{path} is truncated: {len(raw) - header} data bytes, expected {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write an unsigned-byte IDX file (used to prepare MNIST-format data)."""
    data = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, data.ndim]) + struct.pack(f">{data.ndim}I", *data.shape)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(header + data.tobytes())


def make_synthetic(samples: int, side: int = 28) -> Dataset:
    if samples < 2 * NUM_CLASSES:
        raise DataError(f"--synthetic-samples must be at least {2 * NUM_CLASSES}, got {samples}")
    rng = np.random.default_rng(SPLIT_SEED)
    images = rng.random((samples, side, side, 1), dtype=np.float32)
    teacher = rng.standard_normal((side * side, NUM_CLASSES)).astype(np.float32)
    # Centred inputs: the teacher then spreads the samples over all classes.
    labels = np.argmax((images.reshape(samples, -1) - 0.5) @ teacher, axis=1).astype(np.int64)
    cut = samples - max(samples // 5, 1)
    return Dataset("synthetic", images[:cut], labels[:cut], images[cut:], labels[cut:])


def eval_shard(num_samples: int, rank: int, size: int) -> slice:
    """This rank's contiguous, disjoint part of an evaluation set.

    Unlike a training sampler it does not pad, so summing counts over ranks
    gives the exact metric of the whole set.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not within size {size}")
    per_rank, extra = divmod(num_samples, size)
    start = rank * per_rank + min(rank, extra)
    return slice(start, start + per_rank + (1 if rank < extra else 0))
