"""The chaos soak's short variant: 1.5 minutes of jobs and seeded faults, no violation.

`make soak` runs the long one (10 minutes, ~300 jobs; report in docs/soak/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localcluster.paths import REPO


def test_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--minutes",
            "1.5",
            "--jobs",
            "20",
            "--seed",
            "7",
            "--dir",
            str(tmp_path / "cluster"),
            "--port-base",
            "18600",  # apart from the other test clusters
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    written = tmp_path / "out" / "soak.json"
    assert written.exists(), f"no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(written.read_text())
    detail = proc.stdout[-3000:] + proc.stderr[-4000:]
    assert report["violations"] == [], detail
    assert proc.returncode == 0, detail
    assert report["faults_total"] >= 10, report["faults"]
    assert report["invariant_checks"] >= 60
    assert report["jobs_submitted"] == 20
