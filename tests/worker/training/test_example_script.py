"""examples/pytorch-own-script.yaml's script trains under real horovodrun (2 ranks,
Gloo, CPU), and fails when it does not fit: a user's first script, kept working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from localcluster.paths import REPO
from tests.support.training import HOROVODRUN, worker_env

EXAMPLE = REPO / "examples" / "pytorch-own-script.yaml"


def script_of_the_example() -> str:
    config_map = next(
        d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "ConfigMap"
    )
    return str(config_map["data"]["train.py"])


def run(script: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(HOROVODRUN),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        str(script),
    ]
    return subprocess.run(
        command, env=worker_env(), capture_output=True, text=True, timeout=240, cwd=script.parent
    )


def test_the_own_script_example_learns_the_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(script_of_the_example())
    done = run(script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "learned y = 3.00x + -2.00" in done.stdout, done.stdout[-2000:]
    # Only rank 0 reports.
    assert done.stdout.count("learned y") == 1


def test_a_script_that_does_not_fit_fails(tmp_path: Path) -> None:
    """The exit code is the check: a learning rate of zero learns nothing."""
    script = tmp_path / "train.py"
    script.write_text(script_of_the_example().replace("lr=0.05 * hvd.size()", "lr=0.0"))
    done = run(script)
    assert done.returncode != 0, done.stdout[-2000:]
