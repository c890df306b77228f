"""bench.gangs stays runnable: every gang configuration, ours and mpi-operator's with
Volcano and Coscheduling, starts a small job on its gang scheduler (a small case; the
numbers of the full run are in docs/benchmarks/gangs.md, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localcluster.paths import REPO


def test_the_gang_benchmark_runs_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.gangs", "--sizes", "2", "--repeats", "1", "--smoke",
            "--dir", str(tmp_path / "cluster"),
            "--port-base", "19100",  # apart from the test fixtures' and other benches' clusters
            "--out", str(out),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((out / "gangs.json").read_text())
    keys = {"ours", "ours-volcano", "ours-cosched", "mpi-volcano", "mpi-cosched"}
    assert set(result["single"]) == keys, result["single"].keys()
    for key, sizes in result["single"].items():
        assert sizes["2"]["running"]["n"] == 1, (key, sizes)
    assert set(result["ratios_running"]) == {"ours", "ours-volcano", "ours-cosched"}
