"""`python -m bench --quick` end to end against the local control plane.

Asserts only that the harness produces results (numbers for every scenario it
ran, a table, plots when matplotlib is there); nothing about speed. mpi-operator
is included when Go can build it and its fixed health port (8080) is free.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from clusterlib import KubeCluster

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ is not installed

from bench import procs  # noqa: E402


@pytest.mark.timeout(1800)  # a first run builds mpi-operator (minutes on 2 cores)
def test_bench_quick(cluster: KubeCluster, tmp_path: Path) -> None:
    operators = ["ours"]
    if shutil.which("go") and procs.port_free(procs.MPI_HEALTH_PORT):
        operators.append("mpi")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--reuse",
            str(cluster.impl.layout.root),
            "--nodes",
            "0",  # the fixture's kwok nodes have room for the quick sizes
            "--operators",
            ",".join(operators),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads((out / "results-quick.json").read_text())
    for op in operators:
        single = results["single"]["2"][op]
        assert "error" not in single, single
        assert single["pods"]["n"] == 1 and single["pods"]["median"] > 0
        assert single["status_propagation"]["n"] == 1
        burst = results["burst"][op]
        assert "error" not in burst, burst
        assert burst["all_pods"] > 0 and burst["all_running"] > 0
        idle = results["idle"][op]
        assert "error" not in idle, idle
        assert idle["rss_mb"] > 0
    assert "create -> all pods" in proc.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "quick-latency-vs-workers.png").stat().st_size > 0
