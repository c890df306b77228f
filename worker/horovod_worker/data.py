"""Datasets as numpy arrays, the same for both frameworks.

Three sources, none downloaded at run time (worker pods usually have no
internet, and a download race between ranks corrupts files):

- ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real
  images shipped inside the package), the default.
- ``mnist``: the four MNIST IDX files (optionally gzipped) in ``--data-dir``.
- ``synthetic``: random images with labels from a fixed random linear
  teacher, so that a model can learn them; for throughput runs.
- ``imagefolder``: ``--data-dir/train/<class>/<image>`` (PNG, JPEG, ... read
  with Pillow, resized to ``--image-size``, RGB), the test set from
  ``--data-dir/test/<class>/`` (or ``val/``) or else a fixed 20% of train.
- ``csv``: ``--data-dir/train.csv`` (and ``test.csv`` or a fixed 20%): a
  header row, numeric feature columns and an integer ``label`` column; the
  features are standardized with the train set's mean and deviation and fed
  to the same network as 1 x F single-channel "images".

Every rank reads the files itself from the mounted path (a PVC, NFS, ...) and
trains on its own shard of the samples (DistributedSampler / tf.data shard); the
whole set is decoded into memory at start, which suits datasets up to a few GB.

The train/test split is fixed (not tied to ``--seed``) so that every rank
holds the same split whatever seed it was started with.
"""

import gzip
import importlib.util
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASETS = ("digits", "mnist", "synthetic", "imagefolder", "csv")
# Datasets read from --data-dir.
DIR_DATASETS = ("mnist", "imagefolder", "csv")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
CSV_LABEL = "label"
NUM_CLASSES = 10
SPLIT_SEED = 0
# The digits split that train_test_split(test_size=0.2, random_state=SPLIT_SEED,
# stratify=labels) makes, as indices (hack/digits_split.py writes it; a test checks it
# against scikit-learn). With it, a rank reads the digits from the CSV file
# scikit-learn ships and imports no scikit-learn: that import (SciPy beneath it) was
# 0.8 s of every rank's start, after torch's.
DIGITS_SPLIT = Path(__file__).with_name("digits_split.json")
DIGITS_TEST_SIZE = 0.2

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
    """Images as float32 with shape (n, height, width, channels); int64 labels."""

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


def load(
    name: str, data_dir: Path | None = None, synthetic_samples: int = 4096, image_size: int = 32
) -> Dataset:
    """Load a dataset by name; raises DataError with a one-line reason."""
    if name in ("imagefolder", "csv"):
        if data_dir is None:
            raise DataError(f"--dataset {name} needs --data-dir")
        if name == "imagefolder":
            return load_image_folder(data_dir, image_size)
        return load_csv(data_dir)
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
    """scikit-learn's digits, split 80/20 per class; read from its CSV file with the
    recorded split when both are there, else through scikit-learn itself."""
    flat = _digits_csv()
    split = json.loads(DIGITS_SPLIT.read_text()) if DIGITS_SPLIT.is_file() else None
    if flat is None or split is None or split["samples"] != len(flat):
        return load_digits_with_sklearn()
    images = (flat[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., np.newaxis]
    labels = flat[:, -1].astype(np.int64)
    train, test = np.asarray(split["train"]), np.asarray(split["test"])
    return Dataset("digits", images[train], labels[train], images[test], labels[test])


def _digits_csv() -> np.ndarray | None:
    """sklearn/datasets/data/digits.csv.gz (64 pixel columns, then the label), found
    without importing scikit-learn; None when it is not installed there."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        return None
    return np.loadtxt(path, delimiter=",")


def load_digits_with_sklearn() -> Dataset:
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., np.newaxis]
    labels = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=DIGITS_TEST_SIZE, random_state=SPLIT_SEED, stratify=labels
    )
    return Dataset("digits", x_train, y_train, x_test, y_test)


def digits_split() -> dict[str, object]:
    """The split train_test_split makes of the digits' indices (digits_split.json)."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    labels = sklearn_digits().target
    train, test = train_test_split(
        np.arange(len(labels)),
        test_size=DIGITS_TEST_SIZE,
        random_state=SPLIT_SEED,
        stratify=labels,
    )
    return {
        "made_by": "hack/digits_split.py: sklearn.model_selection.train_test_split("
        f"test_size={DIGITS_TEST_SIZE}, random_state={SPLIT_SEED}, stratify=labels)",
        "samples": len(labels),
        "train": [int(i) for i in train],
        "test": [int(i) for i in test],
    }


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


def _split(count: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed 80/20 train/test split of ``count`` samples (independent of --seed)."""
    order = np.random.default_rng(SPLIT_SEED).permutation(count)
    cut = count - max(count // 5, 1)
    return order[:cut], order[cut:]


def image_folder_files(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names (sorted subdirectory names) and (file, class index) pairs, sorted."""
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist (expected {root}/<class>/<image>)")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"image folder {root} has no class subdirectories ({root}/<class>/...)")
    files = [
        (path, index)
        for index, name in enumerate(classes)
        for path in sorted((root / name).rglob("*"))
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
    ]
    if not files:
        raise DataError(f"image folder {root} has no images ({', '.join(IMAGE_SUFFIXES)})")
    return classes, files


def read_images(files: list[tuple[Path, int]], image_size: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image, UnidentifiedImageError

    images = np.empty((len(files), image_size, image_size, 3), dtype=np.float32)
    for i, (path, _) in enumerate(files):
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize(
                    (image_size, image_size), Image.Resampling.BILINEAR
                )
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"cannot read image {path}: {exc}") from None
        images[i] = np.asarray(rgb, dtype=np.float32) / 255.0
    return images, np.array([label for _, label in files], dtype=np.int64)


def load_image_folder(data_dir: Path, image_size: int) -> Dataset:
    train_root = data_dir / "train"
    classes, train_files = image_folder_files(train_root)
    test_root = next((data_dir / n for n in ("test", "val") if (data_dir / n).is_dir()), None)
    if test_root is not None:
        test_classes, test_files = image_folder_files(test_root)
        if test_classes != classes:
            raise DataError(
                f"{test_root} has classes {test_classes}, {train_root} has {classes}: "
                "they must be the same subdirectories"
            )
        x_train, y_train = read_images(train_files, image_size)
        x_test, y_test = read_images(test_files, image_size)
    else:
        if len(train_files) < 2:
            raise DataError(f"{train_root} needs at least 2 images to split off a test set")
        images, labels = read_images(train_files, image_size)
        train, test = _split(len(labels))
        x_train, y_train, x_test, y_test = images[train], labels[train], images[test], labels[test]
    return Dataset("imagefolder", x_train, y_train, x_test, y_test, num_classes=len(classes))


def read_csv(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Feature names, features (float32) and labels (int64) of one CSV file."""
    import csv

    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(rows) < 2:
        raise DataError(f"{path} needs a header row and at least one data row")
    header = [name.strip() for name in rows[0]]
    if CSV_LABEL not in header:
        raise DataError(f"{path} has no '{CSV_LABEL}' column (header: {', '.join(header)})")
    label_at = header.index(CSV_LABEL)
    features = [name for name in header if name != CSV_LABEL]
    if not features:
        raise DataError(f"{path} has no feature columns besides '{CSV_LABEL}'")
    try:
        table = np.array([[float(v) for v in row] for row in rows[1:]], dtype=np.float64)
    except ValueError as exc:
        raise DataError(f"{path}: every value must be a number ({exc})") from None
    labels = table[:, label_at]
    if np.any(labels < 0) or np.any(labels != np.round(labels)):
        raise DataError(f"{path}: '{CSV_LABEL}' must hold class indices 0, 1, 2, ...")
    x = np.delete(table, label_at, axis=1).astype(np.float32)
    return features, x, labels.astype(np.int64)


def load_csv(data_dir: Path) -> Dataset:
    train_path = data_dir / "train.csv"
    if not train_path.is_file():
        raise DataError(f"{train_path} does not exist (--dataset csv reads train.csv, test.csv)")
    features, x, y = read_csv(train_path)
    test_path = data_dir / "test.csv"
    if test_path.is_file():
        test_features, x_test, y_test = read_csv(test_path)
        if test_features != features:
            raise DataError(f"{test_path} has columns {test_features}, train.csv {features}")
        x_train, y_train = x, y
    else:
        train, test = _split(len(y))
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std == 0] = 1.0
    num_classes = int(max(y_train.max(), y_test.max() if len(y_test) else 0)) + 1

    def shaped(a: np.ndarray) -> np.ndarray:
        standardized: np.ndarray = ((a - mean) / std).astype(np.float32)
        return standardized[:, np.newaxis, :, np.newaxis]

    return Dataset("csv", shaped(x_train), y_train, shaped(x_test), y_test, num_classes)
