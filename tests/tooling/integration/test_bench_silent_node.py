"""bench.silent_node stays runnable: a small job starts beside a job stuck on a silent
node whose pods the operator explains from their Warning Events (a small case; the
numbers of the full run are in docs/benchmarks/silent-node.md, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localcluster.paths import REPO


def test_the_silent_node_benchmark_runs_and_reads_events_once_per_interval(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.silent_node",
            "--workers", "16", "--samples", "3", "--window", "30",
            "--dir", str(tmp_path / "cluster"),
            "--port-base", "18700",  # apart from the test fixtures' and other benches' clusters
            "--out", str(out),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((out / "silent-node.json").read_text())
    assert result["big_job_stalled"]["reason"] == "FailedMount", result
    reads = result["event_reads_while_stuck"]["requests"]
    # One namespace read per 10 s over the 30 s window (not one per pod: 16 per 10 s).
    assert 1 <= reads <= 5, result
    assert result["small_job_latency_s"]["stuck"]["median"] > 0
