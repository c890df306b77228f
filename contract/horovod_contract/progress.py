"""The progress record: one line rank 0 prints now and then while it trains.

    HVJOB_PROGRESS {"epoch": 2, "samplesPerSecond": 812.5, "size": 8, "step": 1200}

The operator reads it from rank 0's log (where the time to the first step comes
from) and shows it in status.progress; `runPolicy.progressDeadlineSeconds` ends an
attempt whose step stops moving, and a `size` other than the job's world ends the
job WrongWorldSize. The built-in trainers print it; a script of one's own does too
with three lines:

    from horovod_contract.progress import ProgressReporter
    progress = ProgressReporter(hvd.rank(), hvd.size())
    ...
    progress.step(step, epoch=epoch, samples=samples_so_far)  # every step: cheap

Only rank 0 prints, at its first call and then at most once per interval
(HVJOB_PROGRESS_INTERVAL; 10 s), so the log grows by one line per interval
whatever the number of ranks.

Every rank that calls step() also starts a small thread that says when that rank
has been waiting, one `HVJOB_WAITING {"rank": R, "step": S}` line per interval
while its own step has not moved for that long (nothing while training goes on).
When a hang comes, every rank that is alive and blocked says so; a rank that
says nothing is frozen (stopped, wedged in the kernel or the driver), which
Horovod's own stall inspector cannot tell (its negotiation blocks on that rank
too). The operator names those ranks. Standard library only: any image can copy
this file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

PROGRESS_PREFIX: Final = "HVJOB_PROGRESS"
WAITING_PREFIX: Final = "HVJOB_WAITING"
# Seconds between two records, and between a waiting rank's lines (a float).
ENV_PROGRESS_INTERVAL: Final = "HVJOB_PROGRESS_INTERVAL"
DEFAULT_INTERVAL: Final = 10.0


def progress_line(record: Mapping[str, Any]) -> str:
    """The line that carries `record` (step, size, and epoch/samplesPerSecond when known)."""
    return f"{PROGRESS_PREFIX} {json.dumps(dict(record), sort_keys=True)}"


def progress_in_line(line: str) -> dict[str, Any] | None:
    """The record a line carries, wherever the marker sits (launchers prefix rank
    tags; the kubelet a timestamp), or None when it carries none or a broken one:
    a user's print must never stop the operator's reading of the rest."""
    parsed = _object_after(PROGRESS_PREFIX, line)
    if parsed is None or not isinstance(parsed.get("step"), int):
        return None
    return parsed


def waiting_rank_in_line(line: str) -> int | None:
    """The rank a HVJOB_WAITING line is about, or None."""
    parsed = _object_after(WAITING_PREFIX, line)
    rank = parsed.get("rank") if parsed is not None else None
    return rank if isinstance(rank, int) else None


def _object_after(prefix: str, line: str) -> dict[str, Any] | None:
    """The JSON object after `prefix ` in `line` (what follows it is ignored)."""
    marker = f"{prefix} "
    at = line.find(marker)
    if at < 0:
        return None
    try:
        parsed, _ = json.JSONDecoder().raw_decode(line[at + len(marker) :])
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def interval_from_env(environ: Mapping[str, str] = os.environ) -> float:
    raw = environ.get(ENV_PROGRESS_INTERVAL, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


class ProgressReporter:
    """Prints rank 0's progress record at most once per interval; a no-op elsewhere.

    `samples` is how many samples the whole job has trained on so far (any rank's
    count times the world size, for equal batches); samples per second is
    measured between two records.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        out: TextIO | None = None,
        heartbeat: bool = True,
    ) -> None:
        self.rank, self.size = rank, size
        self.interval = interval if interval is not None else interval_from_env()
        self._clock = clock
        self._out = out
        self._last: tuple[float, int] | None = None  # (when, samples) of the last record
        self._step: tuple[float, int] | None = None  # (when, step) of the last call
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._heartbeat = heartbeat  # the HVJOB_WAITING thread (tests call waiting())

    def step(self, step: int, *, epoch: int | None = None, samples: int | None = None) -> bool:
        """Report `step` (and the epoch, the job's samples so far); True when printed."""
        now = self._clock()
        with self._lock:
            self._step = (now, int(step))
        if self._watcher is None and self._heartbeat:
            self._watcher = threading.Thread(target=self._watch, name="hvjob-progress", daemon=True)
            self._watcher.start()
        if self.rank != 0:
            return False
        if self._last is not None and now - self._last[0] < self.interval:
            return False
        record: dict[str, Any] = {"step": int(step), "size": self.size}
        if epoch is not None:
            record["epoch"] = int(epoch)
        if samples is not None:
            if self._last is not None and now > self._last[0]:
                rate = (samples - self._last[1]) / (now - self._last[0])
                record["samplesPerSecond"] = round(max(rate, 0.0), 1)
            self._last = (now, samples)
        else:
            self._last = (now, 0)
        # One write: under PYTHONUNBUFFERED print() writes the newline apart, and
        # another rank's output can land in between (horovod_worker.common.emit).
        out = self._out or sys.stdout
        out.write(progress_line(record) + "\n")
        out.flush()
        return True

    def waiting(self) -> bool:
        """Print this rank's HVJOB_WAITING line if its step has not moved for an
        interval; True when printed (the thread calls it once per interval)."""
        with self._lock:
            last = self._step
        if last is None or self._clock() - last[0] < self.interval:
            return False
        line = f"{WAITING_PREFIX} {json.dumps({'rank': self.rank, 'step': last[1]})}"
        print(line, file=self._out or sys.stdout, flush=True)
        return True

    def _watch(self) -> None:
        while True:
            time.sleep(self.interval)
            self.waiting()
