"""hack/frameworks_tree.py: a bootstrap's installed files, hard-linked into the next venv."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from localcluster.paths import REPO

SCRIPT = REPO / "hack" / "frameworks_tree.py"
PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def _site(venv: Path) -> Path:
    return venv / "lib" / PY / "site-packages"


def _dist(
    venv: Path,
    name: str,
    version: str,
    files: dict[str, str],
    *,
    editable: bool = False,
) -> None:
    """A distribution as pip leaves it: its files, METADATA, and a RECORD of them."""
    site = _site(venv)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    if editable:
        (info / "direct_url.json").write_text(
            json.dumps({"url": "file:///x", "dir_info": {"editable": True}})
        )
    rows = [[f"{info.name}/METADATA", "", ""], [f"{info.name}/RECORD", "", ""]]
    for relative, text in files.items():  # relative to site-packages, as RECORD has it
        path = Path(os.path.normpath(site / relative))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if relative.startswith("../") else 0o644)
        rows.append([relative, "", ""])
    rows.append(["../../../../outside-the-venv", "", ""])  # never followed out of it
    with (info / "RECORD").open("w", newline="") as record:
        csv.writer(record).writerows(rows)


def _run(action: str, venv: Path, cache: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), action, "--venv", str(venv), "--cache", str(cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stderr


def test_a_saved_venv_comes_back_as_links_and_skips_what_the_new_one_has(tmp_path: Path) -> None:
    old, new, cache = tmp_path / "old" / ".venv", tmp_path / "new" / ".venv", tmp_path / "cache"
    _dist(
        old,
        "torch",
        "2.13.0",
        {
            "torch/__init__.py": "X = 1\n",
            "torch/__pycache__/__init__.cpython.pyc": "pyc",
            "../../../bin/torchrun": f"#!{old}/bin/python\nimport torch\n",
        },
    )
    _dist(old, "setuptools", "84.0", {"setuptools/__init__.py": "new = 1\n"})
    _dist(old, "pip", "26.0", {"pip/__init__.py": ""})
    _dist(old, "horovod_operator", "0.1.0", {"__editable__.x.pth": "/old"}, editable=True)
    _dist(new, "setuptools", "65.5", {"setuptools/__init__.py": "old = 1\n"})
    (old.parent / "outside-the-venv").write_text("in old's RECORD, not in old\n")
    stale = cache / "0123456789abcdef"
    stale.mkdir(parents=True)

    assert "saved 2 distributions" in _run("save", old, cache)
    assert not stale.exists(), "a tree of another key stays behind"
    assert "is current" in _run("save", old, cache)
    assert "linked 1 distributions" in _run("restore", new, cache)

    init = _site(new) / "torch" / "__init__.py"
    assert init.stat().st_ino == (_site(old) / "torch" / "__init__.py").stat().st_ino
    assert (_site(new) / "torch" / "__pycache__" / "__init__.cpython.pyc").is_file()
    assert (_site(new) / "torch-2.13.0.dist-info" / "RECORD").is_file()
    script = new / "bin" / "torchrun"
    assert script.read_text().splitlines()[0] == f"#!{new.absolute()}/bin/python"
    assert os.access(script, os.X_OK)
    # The new venv's own setuptools stays alone; pip and the editable project never come.
    assert (_site(new) / "setuptools" / "__init__.py").read_text() == "old = 1\n"
    assert not list(_site(new).glob("setuptools-84*"))
    assert not (_site(new) / "pip").exists() and not (_site(new) / "__editable__.x.pth").exists()
    assert not (new.parent / "outside-the-venv").exists()
    assert not list(cache.rglob("outside-the-venv"))


def test_restore_without_a_tree_changes_nothing(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    _site(venv).mkdir(parents=True)
    assert "pip installs everything" in _run("restore", venv, tmp_path / "cache")
    assert list(_site(venv).iterdir()) == []
