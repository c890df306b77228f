"""The operator image's install step, run here: it installs a working operator and
no ML framework (Dockerfile.operator runs the same script)."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_install_operator_script_installs_only_the_operator(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(REPO / "hack" / "install-operator.sh"), str(REPO)],
        env={**os.environ, "PIP": str(env_dir / "bin" / "pip")},
        check=True,
        capture_output=True,
        timeout=600,
    )
    help_text = subprocess.run(
        [str(python), "-m", "horovod_operator", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "--namespace" in help_text
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    for heavy in ("torch==", "tensorflow", "horovod==", "scikit-learn"):
        assert heavy not in installed, f"{heavy} must not be in the operator image"
