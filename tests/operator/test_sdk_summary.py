"""The one-line summary `hvjob list`, `wait` and `describe` print."""

from __future__ import annotations

from typing import Any

from horovod_operator.sdk.client import progress_summary, summary

PROGRESS = {
    "attempt": 1,
    "step": 1200,
    "epoch": 3,
    "samplesPerSecond": 812.5,
    "worldSize": 8,
    "lastProgressTime": "2026-12-05T10:31:12Z",
}


def _job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "resnet"}, "status": status}


def test_a_running_job_shows_its_progress() -> None:
    job = _job(phase="Running", restarts=1, reason="LauncherRunning", progress=PROGRESS,
               workers={"summary": "4/4"})  # fmt: skip
    assert summary(job) == (
        "resnet: Running (workers 4/4) LauncherRunning; step 1200 (epoch 3), 812.5 samples/s, "
        "world size 8, last step at 2026-12-05T10:31:12Z"
    )


def test_an_earlier_attempts_progress_is_not_shown() -> None:
    assert progress_summary({"restarts": 2, "progress": PROGRESS}) is None
    assert "step" not in summary(_job(phase="Running", restarts=2, progress=PROGRESS))
    assert progress_summary({}) is None
