"""bench.throughput's page: the table from benchmark results (no Horovod run)."""

from __future__ import annotations

from typing import Any

from bench.throughput import GPU_COMMAND, bench_command, render


def _result(size: int, per_rank: float, single: float) -> dict[str, Any]:
    return {
        "size": size,
        "threads": [2 if size == 1 else 1] * size,
        "images_per_sec_mean_per_rank": per_rank,
        "ci95_per_rank": [0.5] * size,
        "images_per_sec_total": per_rank * size,
        "single_rank_images_per_sec": single,
        "scaling_efficiency": per_rank / single,
    }


def test_table_has_both_efficiencies_and_marks_oversubscription() -> None:
    page = render(
        [_result(1, 100.0, 100.0), _result(2, 40.0, 50.0), _result(4, 20.0, 40.0)],
        cores=2,
        bench_args=["--model=resnet18"],
        when="2026-12-01 11:00 UTC",
        commit="abc1234",
    )
    assert "2026-12-01 11:00 UTC" in page and "`abc1234`" in page
    assert "| 2 | 1 | 40.00 ± 0.50 | 80.00 | 50.00 | 80% | 0.80x |" in page
    assert "| 4 (oversubscribed) | 1 |" in page
    assert "| 1 | 2 |" in page and "(oversubscribed)" not in page.split("| 4")[0]
    assert GPU_COMMAND in page and "512 GPUs" in page
    assert "Load average" not in page  # not measured: not claimed


def test_the_load_each_job_started_under_is_on_the_page() -> None:
    results = [_result(1, 100.0, 100.0), _result(2, 40.0, 50.0)]
    results[0]["load_at_start"], results[1]["load_at_start"] = 0.12, 1.05
    page = render(results, 2, ["--model=resnet18"], "2026-12-02 02:00 UTC", "abc1234")
    assert "Load average (1 min) as each job started: 1 rank(s) 0.12; 2 rank(s) 1.05." in page


def test_each_row_is_one_horovodrun_gloo_job_on_the_cpu() -> None:
    command = bench_command(4, ["--model=resnet18"])
    assert command[1:6] == ["-np", "4", "-H", "localhost:4", "--gloo"]
    assert command[-3:] == ["horovod_worker.benchmark", "--allow-cpu", "--model=resnet18"]
