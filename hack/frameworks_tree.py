#!/usr/bin/env python3
"""A hard-linked tree of what the bootstrap installed into .venv, for the next clone.

A fresh clone's bootstrap spent about 110 s of its ~150-200 s letting pip unpack
the frameworks' 3 GB of wheels from the wheelhouse again (torch, its CUDA
libraries, TensorFlow). This keeps the installed files of every distribution in
~/.cache, hard-linked (no second copy on the disk while a venv holds them), and a
new venv gets them as links in seconds. pip then finds the pins satisfied, and
hack/install-frameworks.sh still imports each framework before it says ready.

    python3 hack/frameworks_tree.py restore --venv .venv --cache DIR   # a new venv
    python3 hack/frameworks_tree.py save --venv .venv --cache DIR      # after bootstrap

The tree is keyed by everything that decides what pip installs here: pyproject.toml,
hack/versions.env, hack/install-frameworks.sh, the interpreter's version and the
machine. A save keeps only its own key (older trees are removed: the disk is CI's
scarcest resource). Not cached: pip (the venv has its own), the project itself (an
editable install that points into its clone), and Horovod (hack/install-worker.sh
keeps its own wheel cache and checks the build). Restore skips any distribution the
venv already has, so two versions of one never sit side by side. Scripts in bin/
are copied with their `#!` line pointing at the new venv's python; every other file
is a hard link, and nothing writes into an installed file in place (pip replaces,
Python writes .pyc files by rename). Where the cache is on another file system than
the venv, nothing is cached: a copy would cost the disk 6 GB.
"""

from __future__ import annotations

import argparse
import csv
import errno
import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_FILES = ("pyproject.toml", "hack/versions.env", "hack/install-frameworks.sh")
# Bump when the layout below changes.
FORMAT = "1"
NOT_CACHED = {"pip", "horovod"}
MANIFEST = "manifest.json"


def say(message: str) -> None:
    print(f"[frameworks-tree] {message}", file=sys.stderr, flush=True)


def key(repo: Path = REPO) -> str:
    digest = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{platform.machine()}\0".encode())
    for name in KEY_FILES:
        digest.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def dist_name(dist_info: Path) -> str:
    for line in (dist_info / "METADATA").read_text(errors="replace").splitlines():
        if line.startswith("Name:"):
            return normalize(line.split(":", 1)[1].strip())
        if not line:
            break
    return normalize(dist_info.name.rsplit("-", 1)[0])


def installed(venv: Path) -> dict[str, Path]:
    """Each distribution in the venv's site-packages, by normalized name."""
    found = {}
    for dist_info in site_packages(venv).glob("*.dist-info"):
        if (dist_info / "METADATA").is_file():
            found[dist_name(dist_info)] = dist_info
    return found


def editable(dist_info: Path) -> bool:
    direct_url = dist_info / "direct_url.json"
    if not direct_url.is_file():
        return False
    info = json.loads(direct_url.read_text())
    return bool(info.get("dir_info", {}).get("editable"))


def recorded_files(venv: Path, dist_info: Path) -> list[str]:
    """The files a distribution installed, relative to the venv, inside it only."""
    site = site_packages(venv)
    files = []
    with (dist_info / "RECORD").open(newline="") as record:
        for row in csv.reader(record):
            if not row:
                continue
            path = Path(os.path.normpath(site / row[0]))
            if not path.is_relative_to(venv):
                continue  # outside the venv: not ours to copy
            if path.is_file():
                files.append(path.relative_to(venv).as_posix())
    return files


def save(venv: Path, cache: Path) -> int:
    target = cache / key()
    if (target / MANIFEST).is_file():
        say(f"{target} is current; nothing to save")
        return 0
    staging = cache / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "tree").mkdir(parents=True)
    manifest: dict[str, list[str]] = {}
    try:
        for name, dist_info in sorted(installed(venv).items()):
            if name in NOT_CACHED or editable(dist_info):
                continue
            files = recorded_files(venv, dist_info)
            for relative in files:
                dest = staging / "tree" / relative
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.exists():  # a namespace package's __init__ in two RECORDs
                    os.link(venv / relative, dest)
            manifest[name] = files
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if err.errno == errno.EXDEV:
            say(f"{cache} is on another file system than {venv}: not cached (a copy costs 6 GB)")
            return 0
        raise
    (staging / MANIFEST).write_text(json.dumps(manifest))
    try:
        staging.rename(target)
    except OSError:  # another bootstrap saved the same key first
        shutil.rmtree(staging, ignore_errors=True)
    for old in cache.iterdir():
        if old.name != target.name and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)
    count = sum(len(files) for files in manifest.values())
    say(f"saved {len(manifest)} distributions ({count} files, hard links) under {target}")
    return 0


def restore(venv: Path, cache: Path) -> int:
    source = cache / key()
    if not (source / MANIFEST).is_file():
        say(f"no tree for this key under {cache}; pip installs everything")
        return 0
    manifest: dict[str, list[str]] = json.loads((source / MANIFEST).read_text())
    present = installed(venv)
    python = (venv / "bin" / "python").absolute()
    linked = 0
    done = []
    try:
        for name, files in manifest.items():
            if name in present:
                continue
            for relative in files:
                src = source / "tree" / relative
                dest = venv / relative
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.exists():
                    continue
                if relative.startswith("bin/"):
                    copy_script(src, dest, python)
                else:
                    os.link(src, dest)
                linked += 1
            done.append(name)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        say(f"{cache} is on another file system than {venv}: pip installs what is not linked")
    say(f"linked {len(done)} distributions ({linked} files) from {source}")
    return 0


def copy_script(src: Path, dest: Path, python: Path) -> None:
    """A console script, its `#!` line naming this venv's python."""
    data = src.read_bytes()
    if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        data = b"#!" + str(python).encode() + b"\n" + data.split(b"\n", 1)[1]
    dest.write_bytes(data)
    shutil.copymode(src, dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("--venv", type=Path, default=REPO / ".venv")
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache" / "horovod-operator" / "frameworks"
    )
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    venv = Path(os.path.abspath(args.venv))
    return save(venv, args.cache) if args.action == "save" else restore(venv, args.cache)


if __name__ == "__main__":
    sys.exit(main())
