"""Small datasets written to disk for the --dataset imagefolder / csv tests."""

from pathlib import Path

import numpy as np

# Sorted names in channel order: ImageFolder numbers classes by sorted name.
CLASSES = ("0-red", "1-green", "2-blue")


def write_image_folder(root: Path, per_class: int = 30, side: int = 12, test: bool = True) -> None:
    """``root/train/<class>/*.png`` (and ``root/test/``): each class is the image's
    brightest colour channel, so that a small network learns it in an epoch or two."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for part, count in (("train", per_class), ("test", per_class // 3 if test else 0)):
        for index, name in enumerate(CLASSES * bool(count)):
            folder = root / part / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 110, (side, side, 3))
                pixels[..., index] += 140
                suffix = ".png" if i % 2 else ".jpg"
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i:03d}{suffix}")


def write_csv(path: Path, rows: int = 300, features: int = 6, seed: int = 5) -> None:
    """A header, ``features`` numeric columns and a ``label`` (3 classes, linearly separable)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)) * 3 + 10
    teacher = np.random.default_rng(0).normal(size=(features, 3))
    labels = np.argmax((x - 10) @ teacher, axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f"f{i}" for i in range(features)]
    lines = [",".join([*names[:2], "label", *names[2:]])]
    for row, label in zip(x, labels, strict=True):
        values = [f"{v:.5f}" for v in row]
        lines.append(",".join([*values[:2], str(int(label)), *values[2:]]))
    path.write_text("\n".join(lines) + "\n")
