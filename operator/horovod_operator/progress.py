"""How a Running job's training goes, read from rank 0's log: first step, progress, hangs.

Rank 0's output lands in one log (first_step.rank0_sources: the launcher's, worker
0's for gloo, an elastic job's rank-0 worker). The watcher reads it forward, from
the last line it read (sinceTime), and learns (training_log.py):
- rank 0's start line: status.firstStepTime, a TrainingStarted Event and the
  time-to-first-step histogram;
- rank 0's HVJOB_PROGRESS records: status.progress (step, epoch, samples per
  second, world size, when the step last moved) and two gauges;
- Horovod's stall inspector reports: which ranks the others wait for.

It writes status.progress.hung when runPolicy.progressDeadlineSeconds passed since
the step last moved, by a read that reached the end of the log (a read that lags
never declares a hang); phases.py then ends the attempt as Hung. A world size other
than the job's ends it WrongWorldSize (phases.py too).

Costs, whatever the number of workers: one GET of the log per Running job every
READ_INTERVAL seconds (a quarter of progressDeadlineSeconds when that is shorter;
before the first step 2 s, growing to 30), each at most READ_LIMIT bytes, on the
diagnostics budget (kube.py); a read that came back full is followed by the next
at once. Status writes: the first record and a changed world size at once, a
moving step at most every WRITE_INTERVAL, a hang once. Only the leader reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Final

from . import kinds, metrics, names, training_log
from .api import STARTING_PHASES, TERMINAL_PHASES, manager_of
from .conditions import format_time, now_utc, parse_time
from .first_step import REASON_TRAINING_STARTED, rank0_sources
from .kube import Kube
from .kube_errors import KubeError
from .memory import Indexes, Key
from .progress_watch import JobWatch, new_watch, who_hangs

logger = logging.getLogger(__name__)

READ_LIMIT: Final = 1024 * 1024
READ_INTERVAL: Final = 30.0
WRITE_INTERVAL: Final = 30.0
# Before the first step: soon after the launcher runs (MIN_INTERVAL), then less often.
MAX_INTERVAL: Final = 30.0
# A hang's status keeps this many ranks (its message names fewer: progress_watch).
MAX_RANKS: Final = 32
# Reads tried for the first step of a job that ended before it was read.
LAST_LOOKS: Final = 3


def read_interval(deadline: int | None) -> float:
    """Seconds between two reads of a started job: a hang is found at most this late."""
    return min(READ_INTERVAL, deadline / 4) if deadline else READ_INTERVAL


class ProgressWatcher:
    """Reads rank 0's log of every Running job (see the module's docstring)."""

    def __init__(
        self,
        kube: Kube,
        indexes: Callable[[], Indexes],
        active: Callable[[], bool],
        tick: float = 1.0,
    ) -> None:
        self.kube = kube
        self._indexes = indexes
        self._active = active
        self.tick = tick
        self._watches: dict[Key, JobWatch] = {}
        # Jobs this process saw Pending or Starting and not yet Running: one that ends
        # from there still gets a last look (status writes can skip Running).
        self._starting: set[Key] = set()

    async def run(self) -> None:
        while True:
            if self._active():
                try:
                    await self.scan(time.monotonic())
                except Exception:  # a bug here must not stop the operator's other work
                    logger.exception("progress watcher: scan failed")
            await asyncio.sleep(self.tick)

    async def scan(self, now_s: float) -> None:
        indexes = self._indexes()
        for key, bodies in list(indexes.jobs.items()):
            body = next(iter(bodies), None)
            if body is None:
                continue
            if manager_of(body) is not None:
                continue  # another controller's job: its pods are not here
            status = body.get("status") or {}
            uid = str(body["metadata"].get("uid") or "")
            attempt = int(status.get("restarts") or 0)
            watch = self._watches.get(key)
            if watch is not None and (watch.uid, watch.attempt) != (uid, attempt):
                watch = None
            phase = status.get("phase")
            if phase in TERMINAL_PHASES:
                await self._last_look(
                    key, body, list(indexes.of(kinds.POD).get(key, ())), watch, now_s
                )
                continue
            if phase != "Running":
                self._forget(key)
                if phase in STARTING_PHASES:
                    self._starting.add(key)
                continue
            self._starting.discard(key)
            if watch is None:
                watch = self._watches[key] = new_watch(uid, attempt, status, now_s)
            if watch.moved is not None:
                seconds = (now_utc() - parse_time(watch.moved)).total_seconds()
                metrics.JOB_SECONDS_SINCE_PROGRESS.labels(*key).set(max(0.0, seconds))
            if now_s >= watch.due:
                await self._look(key, body, list(indexes.of(kinds.POD).get(key, ())), watch, now_s)
        for key in set(self._watches) - set(indexes.jobs.keys()):
            self._forget(key)
        self._starting &= set(indexes.jobs.keys())

    async def _last_look(
        self,
        key: Key,
        body: Mapping[str, Any],
        pods: list[Mapping[str, Any]],
        watch: JobWatch | None,
        now_s: float,
    ) -> None:
        """A short job can end between two looks, or before this process saw it
        Running (its Running write came after the launcher ended): a last look for its
        first step, if this process saw the attempt start (its pods are still there; a
        job first seen finished is never read). A refused read is asked again, a few
        times, after the usual backoff."""
        status = body.get("status") or {}
        if watch is None and key in self._starting:
            watch = self._watches[key] = new_watch(
                str(body["metadata"].get("uid") or ""), int(status.get("restarts") or 0),
                status, now_s,
            )  # fmt: skip
        self._starting.discard(key)
        if watch is None or watch.started or status.get("firstStepTime"):
            self._forget(key)
            return
        if now_s < watch.due and watch.last_looks:
            return
        watch.last_looks += 1
        read = await self._look(key, body, pods, watch, now_s, True)
        if read or watch.last_looks >= LAST_LOOKS:
            self._forget(key)

    def _forget(self, key: Key) -> None:
        if self._watches.pop(key, None) is not None:
            for gauge in (metrics.JOB_SAMPLES_PER_SECOND, metrics.JOB_SECONDS_SINCE_PROGRESS):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)

    async def _look(
        self,
        key: Key,
        body: Mapping[str, Any],
        pods: list[Mapping[str, Any]],
        watch: JobWatch,
        now_s: float,
        final: bool = False,
    ) -> bool:
        """Read what rank 0 wrote since the last look; False when no log answered."""
        deadline = ((body.get("spec") or {}).get("runPolicy") or {}).get("progressDeadlineSeconds")
        sources = rank0_sources(body, pods)
        known = [source for source in sources if source[0] == watch.source]
        if known:
            sources = known
        elif len(sources) > 1:
            # An elastic job's candidates: each read from its start until one of them
            # has rank 0's lines (a cursor is one log's).
            watch.cursor = None
        reading: training_log.Reading | None = None
        for pod, container in sources:
            since = f"{watch.cursor[:19]}Z" if watch.cursor else None
            try:
                log = await self.kube.pod_log(key[0], pod, container, READ_LIMIT, since)
            except KubeError as error:
                # Not started yet (400), gone (404), or no access: look again later.
                logger.debug("progress watcher: log of %s/%s: %s", key[0], pod, error)
                continue
            candidate = training_log.read(log, after=watch.cursor)
            # An elastic job's one Running worker is not yet rank 0's: the driver may
            # start rank 0 on another that comes up next. Tied to it, the watcher never
            # read rank 0's line (CI's kind rung of e9ffd8a).
            only = len(sources) == 1 and not (body.get("spec") or {}).get("elastic")
            if only or candidate.rank0_seen or candidate.records:
                watch.source, reading = pod, candidate
                watch.caught_up = len(log.encode()) < READ_LIMIT
                if since and not watch.caught_up and candidate.last_stamp is None:
                    # More than READ_LIMIT within one second: sinceTime (whole seconds)
                    # would send the same bytes again. The rest of that second is skipped.
                    watch.cursor = format_time(parse_time(since) + timedelta(seconds=1))
                break
        if reading is None:
            watch.due = now_s + watch.delay
            watch.delay = min(MAX_INTERVAL, watch.delay * 1.5)
            return False
        patch: dict[str, Any] = {}
        before = (watch.cursor, watch.started)
        first = self._learn(watch, reading, body, final)
        if first is not None:
            patch["firstStepTime"] = first
        progress = None if final else self._progress(key, watch, now_s, deadline, body)
        if progress is not None:
            patch["progress"] = progress
        if watch.caught_up:
            if watch.started or watch.step is not None:
                watch.due = now_s + read_interval(deadline)
            else:
                watch.due = now_s + watch.delay
                watch.delay = min(MAX_INTERVAL, watch.delay * 1.5)
        else:
            watch.due = now_s  # more to read: at the next tick
        if patch:
            try:
                await self._write(key, body, patch, watch, now_s)
            except KubeError as error:
                # Not written (a 429 or 5xx of a loaded API server): read these lines
                # again after the backoff. Marked started with its line already behind
                # the cursor, the first step was lost for good (kind CI, 2026-12-05).
                watch.cursor, watch.started = before
                watch.due = now_s + watch.delay
                logger.info("job %s/%s: progress not written: %s", *key, error)
                return False
        return True

    def _learn(
        self, watch: JobWatch, reading: training_log.Reading, body: Mapping[str, Any], final: bool
    ) -> str | None:
        """Fold a reading into `watch`; the firstStepTime to write, if it is new."""
        if reading.last_stamp is not None:
            watch.cursor = reading.last_stamp
        watch.hosts.update(reading.hosts)
        if reading.sizes:
            watch.size = reading.sizes[-1]
        if reading.missing is not None:
            watch.missing, watch.missing_stamp = reading.missing, reading.missing_stamp
        for stamp, rank in reading.waiting:
            watch.heard[rank] = stamp or format_time(now_utc())
        for stamp, record in reading.records:
            if record["step"] != watch.step:
                # In whole seconds, as every time in the status.
                moved = f"{stamp[:19]}Z" if stamp else format_time(now_utc())
                watch.step, watch.moved = record["step"], moved
            watch.record = record
        first = None
        if reading.rank0_seen and not watch.started:
            watch.started = True
            if not (body.get("status") or {}).get("firstStepTime"):
                stamp = reading.rank0_stamp
                # Read after the job finished with no timestamp on the line: "now"
                # would be after the end. Not measured rather than wrong.
                if stamp is not None or not final:
                    first = f"{stamp[:19]}Z" if stamp else format_time(now_utc())
        return first

    def _progress(
        self, key: Key, watch: JobWatch, now_s: float, deadline: int | None, body: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """status.progress to write now, or None (unchanged, or not yet worth a write)."""
        if watch.step is None and watch.size is None:
            return None
        record = watch.record
        progress: dict[str, Any] = {"attempt": watch.attempt}
        for name, value in (
            ("step", watch.step),
            ("epoch", record.get("epoch")),
            ("samplesPerSecond", record.get("samplesPerSecond")),
            ("worldSize", watch.size),
            ("lastProgressTime", watch.moved),
        ):
            if value is not None:
                progress[name] = value
        if isinstance(record.get("samplesPerSecond"), int | float):
            metrics.JOB_SAMPLES_PER_SECOND.labels(*key).set(record["samplesPerSecond"])
        if watch.hung:
            return None
        hung = self._hung(watch, body, deadline) if watch.caught_up else None
        if hung is not None:
            watch.hung = True
            progress["hung"] = hung
            return progress
        written = watch.written
        if progress == written:
            return None
        urgent = not written or written.get("worldSize") != progress.get("worldSize")
        if urgent or now_s - watch.written_at >= WRITE_INTERVAL:
            return progress
        return None

    def _hung(
        self, watch: JobWatch, body: Mapping[str, Any], deadline: int | None
    ) -> dict[str, Any] | None:
        if not deadline or watch.moved is None:
            return None
        now = now_utc()
        silent = (now - parse_time(watch.moved)).total_seconds()
        if silent <= deadline:
            return None
        step = f"step {watch.step}" if watch.step is not None else "the last step"
        message, ranks, pods = who_hangs(watch, body)
        return {
            "time": format_time(now),
            "message": f"no new step for {silent:.0f}s (progressDeadlineSeconds {deadline}) "
            f"after {step}: {message}",
            "ranks": ranks[:MAX_RANKS],
            "pods": pods[:MAX_RANKS],
        }

    async def _write(
        self,
        key: Key,
        body: Mapping[str, Any],
        patch: dict[str, Any],
        watch: JobWatch,
        now_s: float,
    ) -> None:
        try:
            await self.kube.patch_job_status(key[0], key[1], None, patch)
        except KubeError as error:
            if error.not_found:
                return
            raise
        if "progress" in patch:
            watch.written, watch.written_at = patch["progress"], now_s
            if "hung" in patch["progress"]:
                text = patch["progress"]["hung"]["message"]
                logger.warning("job %s/%s: hung: %s", *key, text, extra=names.log_fields(*key))
        if "firstStepTime" in patch:
            await self._first_step(key, body, patch["firstStepTime"])

    async def _first_step(self, key: Key, body: Mapping[str, Any], stamp: str) -> None:
        created = body["metadata"].get("creationTimestamp")
        waited = (parse_time(stamp) - parse_time(created)).total_seconds() if created else None
        if waited is not None:
            metrics.TIME_TO_FIRST_STEP.labels(namespace=key[0]).observe(max(0.0, waited))
        message = "rank 0 started training" + (
            f", {waited:.0f}s after the job was created" if waited is not None else ""
        )
        await self.kube.post_event(
            body, "Normal", REASON_TRAINING_STARTED, message, format_time(now_utc())
        )
        logger.info("job %s/%s: %s", *key, message, extra=names.log_fields(*key))
