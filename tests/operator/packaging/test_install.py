"""The operator image's install step, run here on exactly the files
Dockerfile.operator copies: it installs a working operator, the contract it
shares with the worker, and neither the worker package nor any ML framework."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

from localcluster.paths import REPO

# What Dockerfile.operator's build stage copies (its COPY lines).
IMAGE_SOURCES = ("pyproject.toml", "README.md", "operator", "contract", "hack/install-operator.sh")


def copy_image_sources(dest: Path) -> None:
    for source in IMAGE_SOURCES:
        (dest / source).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / source).is_dir():
            shutil.copytree(
                REPO / source, dest / source, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(REPO / source, dest / source)


def test_dockerfile_copies_the_sources_this_test_installs() -> None:
    copied = [
        line.split()[1:-1]
        for line in (REPO / "Dockerfile.operator").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    assert sorted(s.rstrip("/") for group in copied for s in group) == sorted(IMAGE_SOURCES)


def test_install_operator_script_installs_only_the_operator(tmp_path: Path) -> None:
    src = tmp_path / "src"
    copy_image_sources(src)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # As in the image: nothing from the caller's PYTHONPATH or this checkout (python -I)
    # can stand in for what the script installed.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(src / "hack" / "install-operator.sh"), str(src)],
        env={**clean_env, "PIP": str(env_dir / "bin" / "pip")},
        check=True,
        capture_output=True,
        timeout=600,
    )
    help_text = subprocess.run(
        [str(python), "-I", "-m", "horovod_operator", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=clean_env,
    ).stdout
    assert "--namespace" in help_text
    worker = subprocess.run(
        [str(python), "-I", "-c", "import horovod_worker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode != 0 and "No module named 'horovod_worker'" in worker.stderr
    installed = subprocess.run(
        [str(python), "-I", "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env,
    ).stdout.lower()
    for heavy in ("torch==", "tensorflow", "horovod==", "scikit-learn"):
        assert heavy not in installed, f"{heavy} must not be in the operator image"
