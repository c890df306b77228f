"""The progress record rank 0 prints (horovod_contract.progress)."""

from __future__ import annotations

import io

from horovod_contract.progress import (
    ProgressReporter,
    interval_from_env,
    progress_in_line,
    progress_line,
    waiting_rank_in_line,
)


def _reporter(rank: int, clock: list[float]) -> tuple[ProgressReporter, io.StringIO]:
    out = io.StringIO()
    reporter = ProgressReporter(
        rank, 4, interval=10.0, clock=lambda: clock[0], out=out, heartbeat=False
    )
    return reporter, out


def test_rank_0_prints_at_its_first_step_then_once_per_interval() -> None:
    clock = [100.0]
    reporter, out = _reporter(0, clock)
    assert reporter.step(1, epoch=0, samples=128)
    clock[0] = 105.0
    assert not reporter.step(2, epoch=0, samples=256)  # within the interval
    clock[0] = 110.0
    assert reporter.step(3, epoch=0, samples=384)
    records = [progress_in_line(line) for line in out.getvalue().splitlines()]
    assert records == [
        {"epoch": 0, "size": 4, "step": 1},
        # 384 - 128 samples in the 10 s since the last record.
        {"epoch": 0, "samplesPerSecond": 25.6, "size": 4, "step": 3},
    ]


def test_other_ranks_print_nothing() -> None:
    reporter, out = _reporter(1, [0.0])
    assert not reporter.step(1, samples=1)
    assert out.getvalue() == ""


def test_a_record_is_found_behind_any_prefix_and_a_broken_one_is_skipped() -> None:
    line = progress_line({"step": 7, "size": 2})
    assert progress_in_line(f"2026-12-05T01:02:03.5Z [1,0]<stdout>:{line}") == {
        "size": 2,
        "step": 7,
    }
    assert progress_in_line("HVJOB_PROGRESS {not json") is None
    assert progress_in_line('HVJOB_PROGRESS {"step": "seven"}') is None
    assert progress_in_line("HVJOB_PROGRESS [1]") is None
    assert progress_in_line("an ordinary line") is None


def test_the_interval_comes_from_the_environment_with_a_safe_default() -> None:
    assert interval_from_env({"HVJOB_PROGRESS_INTERVAL": "2.5"}) == 2.5
    assert interval_from_env({"HVJOB_PROGRESS_INTERVAL": "soon"}) == 10.0
    assert interval_from_env({"HVJOB_PROGRESS_INTERVAL": "-1"}) == 10.0
    assert interval_from_env({}) == 10.0


def test_a_rank_whose_step_stopped_says_it_is_waiting_once_per_interval() -> None:
    clock = [100.0]
    reporter, out = _reporter(2, clock)
    assert not reporter.waiting()  # no step yet: nothing to wait after
    reporter.step(7)
    clock[0] = 105.0
    assert not reporter.waiting()  # training goes on
    clock[0] = 111.0
    assert reporter.waiting()
    assert [waiting_rank_in_line(line) for line in out.getvalue().splitlines()] == [2]
    assert '"step": 7' in out.getvalue()
    assert waiting_rank_in_line("[1,3]<stdout>:HVJOB_WAITING {broken") is None


def test_every_rank_that_reports_starts_one_waiting_thread() -> None:
    reporter = ProgressReporter(1, 2, interval=3600.0, out=io.StringIO())
    reporter.step(1)
    reporter.step(2)
    assert reporter._watcher is not None and reporter._watcher.daemon
