"""The record of the GPU worker images' tests, for a machine that does not build them.

The two GPU images (torch-gpu, tf-gpu) each compile Horovod with CUDA and NCCL: on
a new 2-core machine they were the longest steps of a cold CI run (torch-gpu 1,459
s at idle priority, tf-gpu still unfinished after two hours: docs/dev/ci-times.md).
Their tests only read the built image (`horovodrun --check-build`, ldd, the CUDA
kernels in the extension); no GPU runs here. So a machine that has built and
tested them writes down every answer the image gave to the tests' questions
(`make record-gpu-images`), under a key of every input of the build and of the
tests, and a machine without the image runs the same tests on those answers.

Why the record cannot claim what was not verified:

- the key is a hash of every file the build reads (Dockerfile.worker, what its
  stages COPY or bind-mount from the context, the version pins, hack/images.sh
  that drives the build) and of the tests that ask the questions
  (tests/worker/images, their support modules, this file), and the version the
  images are tagged with (tests/tooling/test_image_record.py checks the list).
  A change to any of them gives another key, and the tests then build the image
  for real, as before;
- it is written only by a session in which every test of the recorded images
  passed against the real image (tests/worker/images/conftest.py), by the same
  code that answers a live run;
- the answers are the image's raw outputs (the commands' stdout, readelf's), not
  verdicts: the tests' assertions run on them again, so a test that would fail on
  the real image fails on the record too;
- the tests print which targets they answered from the record, its date and commit.

What it does not pin: Debian's packages and PyPI's files at build time (neither is
pinned by a real build either; the wheels are pinned by version).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from typing import Any

from .paths import REPO

RECORD = REPO / "tests" / "worker" / "images" / "gpu-record.json"
GPU_TARGETS = ("torch-gpu", "tf-gpu")
# Everything a GPU image's build reads or its tests ask (files, or folders taken whole).
INPUTS = (
    "Dockerfile.worker",
    ".dockerignore",
    "hack/images.sh",
    "hack/install-frameworks.sh",
    "hack/install-worker.sh",
    "hack/patches",
    "hack/versions.env",
    "contract/horovod_contract",
    "worker/horovod_worker",
    "tests/worker/images",
    "tests/support/docker.py",
    "tests/support/elf.py",
    "tests/support/prerequisites.py",
    "localcluster/image_record.py",
    "localcluster/versions.py",
)


def version() -> str:
    """The images' version (hack/images.sh version: pyproject.toml's)."""
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(r'^version = "(.*)"$', text, re.M)
    return match.group(1) if match else ""


def input_files() -> list[str]:
    """The inputs' files, as git knows them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *INPUTS],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    record = RECORD.relative_to(REPO).as_posix()
    return sorted({path for path in listed.split("\0") if path and path != record})


def inputs_key(target: str) -> str:
    """sha256 of the target, the version, and every input file's path and bytes."""
    digest = hashlib.sha256(f"{target}\0{version()}\0".encode())
    for path in input_files():
        file = REPO / path
        if not file.is_file():  # deleted in the work tree, still in git's index
            continue
        digest.update(path.encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).hexdigest().encode() + b"\0")
    return digest.hexdigest()


def load() -> dict[str, Any]:
    if not RECORD.exists():
        return {}
    loaded: dict[str, Any] = json.loads(RECORD.read_text())
    return loaded


def current(target: str) -> dict[str, Any] | None:
    """The target's record when it was made from exactly these inputs, else None."""
    entry: dict[str, Any] | None = load().get(target)
    if entry is None or entry.get("key") != inputs_key(target):
        return None
    return entry


def write(entries: dict[str, dict[str, Any]]) -> None:
    """Store these targets' records beside the others', one line per answer for diffs."""
    record = load()
    record.update(entries)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def describe(target: str) -> str:
    entry = load().get(target)
    if entry is None:
        return f"{target}: no record"
    state = "current" if entry.get("key") == inputs_key(target) else "stale (inputs changed)"
    return (
        f"{target}: record of {entry.get('recorded')} at {str(entry.get('commit'))[:12]}, "
        f"{len(entry.get('answers') or {})} answers, {state}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.image_record",
        description="Whether the GPU images' test record matches this tree's inputs.",
    )
    parser.add_argument("command", choices=("check", "show"))
    parser.add_argument("targets", nargs="*", default=list(GPU_TARGETS))
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in GPU_TARGETS]
    if unknown:
        parser.error(f"not a GPU target: {' '.join(unknown)} (one of {' '.join(GPU_TARGETS)})")
    for target in args.targets:
        print(describe(target))
    if args.command == "check":
        return 0 if all(current(t) is not None for t in args.targets) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
