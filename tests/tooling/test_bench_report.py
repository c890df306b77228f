"""Formatting of benchmark results: ratios, the Markdown table, the plots (pure)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bench import manifests, report
from bench.run import clip
from bench.stats import summarize
from tests.support.prerequisites import require_module

RESULTS = {
    "meta": {
        "operators": {"ours": {}, "mpi": {}, "mpi-defaults": {}},
        "loadavg_start": [1.0, 1.0, 1.0],
        "loadavg_end": [2.0, 1.5, 1.0],
        "machine": {"cores": 2},
    },
    "single": {
        "8": {
            "ours": {
                "pods": summarize([0.5, 0.6]),
                "running": summarize([0.7, 0.8]),
                "status_propagation": summarize([0.2]),
                "api_per_job": {"create pods": 8.0, "writes (total)": 14.0},
            },
            "mpi": {
                "pods": summarize([1.0, 1.2]),
                "running": summarize([1.4, 1.6]),
                "status_propagation": summarize([0.1]),
                "api_per_job": {"create pods": 8.0, "writes (total)": 20.0},
            },
            "mpi-defaults": {"error": "timed out"},
        },
        "512": {"ours": {"pods": summarize([9.0])}, "mpi": {"pods": summarize([10.0])}},
    },
    "burst": {
        "ours": {
            "jobs": 100,
            "workers": 8,
            "all_pods": 20.0,
            "all_running": 25.0,
            "process": {"cpu_seconds": 30.0, "rss_peak_mb": 120.0},
        },
        "mpi": {
            "jobs": 100,
            "workers": 8,
            "all_pods": 40.0,
            "all_running": 50.0,
            "process": {"cpu_seconds": 10.0, "rss_peak_mb": 60.0},
        },
    },
    "idle": {"ours": {"jobs": 1000, "rss_mb": 100.0}, "mpi": {"jobs": 1000, "rss_mb": 50.0}},
}


def test_ratios_are_ours_over_theirs() -> None:
    r = report.ratios(RESULTS)["ours/mpi"]
    assert r["1x8 pods"] == pytest.approx(0.55 / 1.1, abs=1e-3)
    assert r["1x8 status_propagation"] == 2.0
    assert r["1x8 api writes/job"] == 0.7
    assert r["1x512 pods"] == 0.9
    assert r["burst all_pods"] == 0.5
    assert r["idle rss"] == 2.0
    assert "ours/mpi-defaults" not in report.ratios(RESULTS)  # it only has an error


def test_our_gangless_configuration_gets_its_own_ratios_and_column() -> None:
    res: dict[str, Any] = copy.deepcopy(RESULTS)
    res["meta"]["operators"]["ours-nogang"] = {}
    res["single"]["8"]["ours-nogang"] = {"pods": summarize([0.4, 0.48])}
    rat = report.ratios(res)
    assert rat["ours-nogang/mpi"] == {"1x8 pods": pytest.approx(0.44 / 1.1, abs=1e-3)}
    assert rat["ours/mpi"] == report.ratios(RESULTS)["ours/mpi"]
    head = report.table(res).splitlines()[2]
    assert head.startswith("| measure | horovod-operator | horovod-operator (no gang"), head


def test_the_gangless_job_asks_for_no_gang_and_the_default_one_leaves_it_to_auto() -> None:
    assert manifests.horovod_job("j", 8, gang="None")["spec"]["scheduling"] == {
        "gang": {"policy": "None"}
    }
    assert "scheduling" not in manifests.horovod_job("j", 8)["spec"]


def test_table_has_every_measure_and_marks_errors() -> None:
    text = report.table(RESULTS)
    assert (
        "| 1 job x 8 workers: create -> all pods (workers + launcher) | 0.55 / 0.59 (n=2)" in text
    )
    assert "| error |" in text
    assert "burst 100 x 8: every pod exists | 20.00 s | 40.00 s | not run |" in text
    assert "RSS idle with 1000 finished jobs | 100.0 MB | 50.0 MB | not run |" in text
    assert "1 x 8: writes (total) | 14.0 | 20.0 | - |" in text
    assert "Load average" in text


def test_plots_are_written(tmp_path: Path) -> None:
    require_module("matplotlib")
    written = report.plots(RESULTS, tmp_path, prefix="t-")
    assert {p.name for p in written} == {"t-latency-vs-workers.png", "t-burst.png"}
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_scenario_error_keeps_the_end_where_a_process_log_names_the_cause() -> None:
    log = "\n".join(f"info line {i}" for i in range(400))
    error = f"TrainerError: trainer exited (1):\n{log}\nlisten tcp 127.0.0.1:60611: bind"
    kept = clip(error)
    assert kept.startswith("TrainerError: trainer exited (1):")
    assert kept.endswith("listen tcp 127.0.0.1:60611: bind")
    assert len(kept) < 2100
    assert clip("short") == "short"
