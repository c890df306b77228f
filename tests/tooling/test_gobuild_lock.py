"""localcluster.gobuild's build lock: a test waiting for the warm-up's build lifts that
build out of its idle cgroup until the wait is over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import gobuild
from localcluster.paths import REPO

HOLDER = """
import fcntl, sys, time
lock, knob = sys.argv[1], sys.argv[2]
with open(lock, "a") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    print("held", flush=True)
    deadline = time.monotonic() + 20
    while open(knob).read().strip() != "0" and time.monotonic() < deadline:
        time.sleep(0.05)
    print("raised" if open(knob).read().strip() == "0" else "still idle", flush=True)
"""


def test_waiting_for_the_lock_raises_the_warm_up_then_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, knob = tmp_path / "heavy.lock", tmp_path / "cpu.idle"
    knob.write_text("1\n")
    monkeypatch.setattr(gobuild, "HEAVY_LOCK", lock)
    monkeypatch.setattr(gobuild, "WARM_UP_IDLE", knob)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(knob)], cwd=REPO, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with gobuild._heavy_lock():
        assert holder.wait(timeout=30) == 0
        # The holder saw the warm-up's cgroup at normal priority while this one waited.
        assert holder.stdout.read() == "raised\n"
    assert knob.read_text().strip() == "1"


def test_a_free_lock_leaves_the_warm_up_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    knob = tmp_path / "cpu.idle"
    knob.write_text("1\n")
    monkeypatch.setattr(gobuild, "HEAVY_LOCK", tmp_path / "heavy.lock")
    monkeypatch.setattr(gobuild, "WARM_UP_IDLE", knob)
    with gobuild._heavy_lock():
        assert knob.read_text().strip() == "1"


def test_no_cgroup_is_no_error(tmp_path: Path) -> None:
    assert gobuild.set_idle(tmp_path / "missing" / "cpu.idle", False) is False
