"""bench.ceiling stays runnable: a few small steps of jobs on kwok, a probe of each
step finished, and the restart on everything there (the numbers of the full run,
10,000 jobs and 50,000 pods, are in docs/benchmarks/ceiling.md, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localcluster.paths import REPO


def test_the_ceiling_benchmark_grows_in_steps_and_restarts_on_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.ceiling",
            "--jobs", "12", "--step", "6", "--workers", "2", "--probes", "2",
            "--step-timeout", "240",
            "--dir", str(tmp_path / "cluster"),
            "--port-base", "18800",  # apart from the test fixtures' and other benches' clusters
            "--out", str(out),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((out / "ceiling.json").read_text())
    steps = result["steps"]
    assert [s["jobs"] for s in steps] == [6, 12], steps
    for step in steps:
        assert "stopped" not in step, step
        # Every pod of the step's jobs exists (3 per job), none of a finished job gone.
        assert step["pods"] == step["jobs"] * 3, step
        assert step["pod_to_status_s"]["n"] == 2, step
        assert step["rss_mb"] > 0 and step["cpu_s"] >= 0, step
        # Python collected garbage at least once in a step, and the operator said how long.
        assert step["gc_pause_max_s"] > 0 and step["loop_lag_max_cpu_s"] >= 0, step
    restart = result["restart"]
    assert restart["jobs"] == 12 and restart["pods"] == 36, restart
    assert restart["all_reconciled_s"] is not None and restart["settled_rss_mb"] > 0, restart
