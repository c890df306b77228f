"""What the progress watcher (progress.py) knows of one job, where a watch starts after
an operator restart, and who hangs, in words (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from . import names, training_log
from .conditions import format_time, now_utc

# Before the first step a job is read soon after the launcher runs, then less often.
MIN_INTERVAL: Final = 2.0
# A hang's message names this many ranks (and counts the rest).
MAX_NAMED: Final = 5
# A job that started training before this process and has no status.progress: its
# log is read from this many seconds ago, not from its start.
RESTART_LOOKBACK: Final = 600


@dataclass
class JobWatch:
    """What the watcher knows of one job's attempt: where it read to, what it learnt."""

    uid: str
    attempt: int
    due: float
    delay: float = MIN_INTERVAL
    source: str | None = None  # the pod rank 0's lines were found in
    cursor: str | None = None  # the newest line's timestamp read so far
    caught_up: bool = False  # the last read reached the end of the log
    started: bool = False  # firstStepTime is known
    step: int | None = None
    moved: str | None = None  # when the step last changed (the line's time)
    record: dict[str, Any] = field(default_factory=dict)
    size: int | None = None
    hosts: dict[int, str] = field(default_factory=dict)
    missing: list[int] | None = None  # the stall inspector's latest report
    missing_stamp: str | None = None
    written: dict[str, Any] = field(default_factory=dict)  # status.progress as last written
    written_at: float = 0.0
    hung: bool = False
    heard: dict[int, str] = field(default_factory=dict)  # rank -> its last HVJOB_WAITING
    last_looks: int = 0  # reads tried after the job ended


def new_watch(uid: str, attempt: int, status: Mapping[str, Any], now_s: float) -> JobWatch:
    """A job's watch; after an operator restart, from where the status says it was
    (the log is read again from the step's last move: the lines since)."""
    watch = JobWatch(uid=uid, attempt=attempt, due=now_s)
    watch.started = bool(status.get("firstStepTime"))
    stored = status.get("progress") or {}
    if stored.get("attempt", 0) == attempt and stored:
        watch.written = {k: v for k, v in stored.items() if k != "hung"}
        watch.step, watch.moved = stored.get("step"), stored.get("lastProgressTime")
        watch.size = stored.get("worldSize")
        watch.record = {k: stored[k] for k in ("epoch", "samplesPerSecond") if k in stored}
        watch.cursor = watch.moved
        watch.hung = "hung" in stored
    elif watch.started:
        # Started before this process, no progress stored: the recent lines are
        # enough (the whole log of a long job would take many reads).
        watch.cursor = format_time(now_utc() - timedelta(seconds=RESTART_LOOKBACK))
    return watch


def who_hangs(watch: JobWatch, body: Mapping[str, Any]) -> tuple[str, list[int], list[str]]:
    """(what went silent in words, the ranks named, their pods) since the step last moved.

    Two witnesses. Ranks that are alive but blocked print HVJOB_WAITING; with every
    rank's output in one log (mpi: the launcher's), a rank of the world that printed
    nothing is frozen (stopped, wedged in the kernel or driver), which Horovod's
    negotiation blocks on too. Horovod's stall inspector, in rank 0, names ranks
    alive but not submitting the tensors the others wait for."""
    spec = body.get("spec") or {}
    moved = training_log.stamp_key(watch.moved or "")

    def since_move(stamp: str | None) -> bool:
        return stamp is None or training_log.stamp_key(stamp) > moved

    stalled = sorted(set(watch.missing or ())) if since_move(watch.missing_stamp) else []
    heard = {rank for rank, stamp in watch.heard.items() if since_move(stamp)}
    one_log = spec.get("launchMode", "mpi") == "mpi" and not spec.get("elastic")
    frozen: list[int] = []
    if one_log and heard and watch.size:
        frozen = sorted(set(range(watch.size)) - heard - set(stalled))
    parts = []
    if frozen:
        parts.append(
            f"{_ranks_in_words(watch, body, frozen)} printed nothing while the other ranks "
            "reported waiting (a stopped or frozen process)"
        )
    if stalled:
        parts.append(
            f"Horovod's stall inspector names {_ranks_in_words(watch, body, stalled)} as not "
            "submitting the tensors the other ranks wait for"
        )
    named = sorted({*frozen, *stalled})
    if named:
        pods = list(dict.fromkeys(p for p in (_pod_of(watch, body, r) for r in named) if p))
        return "; ".join(parts), named, pods
    rank0 = watch.source or names.launcher_name(body["metadata"]["name"])
    if 0 in heard:
        text = (
            f"rank 0 ({rank0}) reports waiting and Horovod's stall inspector named no rank: a "
            "rank whose output this operator does not read (gloo: another worker's log) is "
            "stuck, or a collective does not return (NCCL, the network)"
        )
    else:
        text = (
            f"no rank reported waiting and Horovod's stall inspector, which runs in rank 0 "
            f"({rank0}), named no rank: rank 0 itself may be stuck, or every rank is inside a "
            "collective that does not return (NCCL, the network)"
        )
    return text, [], [rank0]


def _pod_of(watch: JobWatch, body: Mapping[str, Any], rank: int) -> str | None:
    """The pod a rank runs in: its start line's hostname, else (a fixed-size job) the
    worker its slot is on."""
    host = watch.hosts.get(rank, "")
    if host:
        return host.split(".")[0]
    spec = body.get("spec") or {}
    if spec.get("elastic"):
        return None
    slots = int(spec.get("slotsPerWorker") or 1)
    return names.worker_name(body["metadata"]["name"], rank // slots)


def _ranks_in_words(watch: JobWatch, body: Mapping[str, Any], ranks: list[int]) -> str:
    words = [f"rank {r} ({_pod_of(watch, body, r) or 'pod unknown'})" for r in ranks[:MAX_NAMED]]
    more = f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else ""
    return ", ".join(words) + more
