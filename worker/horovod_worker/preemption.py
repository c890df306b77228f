"""Checkpoint on preemption: SIGTERM stops every rank at one agreed step, with a checkpoint.

When a job is suspended (runPolicy.suspend, a Kueue eviction or preemption) or
a pod is evicted, the kubelet sends SIGTERM to each container and waits the
pod's terminationGracePeriodSeconds (30 s unless the template sets it) before
SIGKILL. In gloo mode the worker (gloo_worker) forwards the signal to its ranks.

A rank cannot just stop on its own: the others would wait for it in the next
allreduce. So the signal only sets a flag, and every CHECK_EVERY steps all ranks
allreduce it (max): the step at which they look is the same everywhere, so they
all stop at the same step. Rank 0 writes a checkpoint of that step (epoch, step,
batch within the epoch), every rank waits for it in one more collective, and all
exit with 143 (128 + SIGTERM). `--resume` continues from it: the same epoch,
the batches after it, the step counter where it stopped.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Final

EXIT_PREEMPTED: Final = 128 + signal.SIGTERM
# Steps between two looks at the flag: each look is one scalar allreduce.
CHECK_EVERY_ENV: Final = "HVJOB_STOP_CHECK_EVERY"
DEFAULT_CHECK_EVERY: Final = 10


# Elastic training (torch_elastic, tf_elastic): steps between two in-memory commits.
COMMIT_EVERY_ENV: Final = "HVJOB_COMMIT_EVERY"
DEFAULT_COMMIT_EVERY: Final = 20

# Elastic training: a file whose appearance ends training after the epoch in which
# any rank saw it, as if --epochs were reached (a run told when to finish, e.g. once
# it has grown; the look rides on the epoch's metrics allreduce, so it costs nothing).
FINISH_FILE_ENV: Final = "HVJOB_FINISH_FILE"


def finish_file_seen() -> float:
    """1.0 when HVJOB_FINISH_FILE names a file that exists here, else 0.0 (summed
    over the ranks, so that all of them end after the same epoch)."""
    path = os.environ.get(FINISH_FILE_ENV)
    return 1.0 if path and os.path.exists(path) else 0.0


class Preempted(Exception):
    """Every rank stopped at an agreed step after SIGTERM; the message says where."""


class Departed(Preempted):
    """Elastic training: this rank got SIGTERM and the others did not. It leaves
    (exit 143, as a preempted rank does); they go on without it."""


class StopOnSignal:
    """The SIGTERM flag, and the agreement on it."""

    def __init__(self, every: int | None = None) -> None:
        self.every = every or int(os.environ.get(CHECK_EVERY_ENV, DEFAULT_CHECK_EVERY))
        if self.every < 1:
            raise ValueError(f"{CHECK_EVERY_ENV} must be at least 1, got {self.every}")
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, _signum: int, _frame: FrameType | None) -> None:
        self.requested = True

    def due(self, step: int) -> bool:
        """Whether the ranks look at the flag after `step` (the same answer on each)."""
        return step % self.every == 0

    def agreed(self, allreduce_max: Callable[[float], float]) -> bool:
        """True on every rank when any rank got SIGTERM (a collective: call it on all)."""
        return allreduce_max(1.0 if self.requested else 0.0) > 0.0


def elastic_look(
    stop: StopOnSignal,
    count: Callable[[float, str], float],
    size: int,
    step: int,
    checkpoint: Callable[[], str],
    commit: Callable[[], None],
    say: Callable[[str], None],
) -> None:
    """Elastic training's agreed look at SIGTERM (torch_elastic, tf_elastic), at a
    step every rank reaches: `count` sums a value over the ranks (a collective).

    Every rank got one (a suspension, the job deleted): `checkpoint` (rank 0
    saves; it returns where, or why nothing was), all wait for it, all stop.
    Only some did (their pods are deleted, evicted, drained): every rank commits
    first, so nothing is lost, then those leave; the others go on without them.
    """
    got = count(1.0 if stop.requested else 0.0, "stop_requests")
    if got == 0:
        return
    if got >= size:
        where = checkpoint()
        count(0.0, "checkpoint_written")  # nobody leaves before rank 0 saved
        raise Preempted(f"every rank got SIGTERM at step {step}; {where}")
    commit_or_leave(commit, stop, step, say)
    if stop.requested:
        _depart(step, say)


def commit_or_leave(
    commit: Callable[[], None], stop: StopOnSignal, step: int, say: Callable[[str], None]
) -> None:
    """An elastic commit (Horovod's ``state.commit()``) that a rank told to go cannot
    turn into a reset.

    The agent of a pod that got SIGTERM answers 503 at once, so the driver may drop
    its host before the ranks' next agreed look at the flag. Then a commit raises
    HostsUpdatedInterrupt on every rank at once (Horovod agrees on it in a
    broadcast). The others reset and go on without this host; this rank must leave
    instead: its reset would meet a rendezvous that no longer lists it, and Horovod
    ends the process from a background thread (std::terminate, exit 134, nothing
    said). Whatever the commit raised, a rank that got SIGTERM leaves with 143.
    """
    try:
        commit()
    except Exception:
        if not stop.requested:
            raise
        _depart(step, say)


def _depart(step: int, say: Callable[[str], None]) -> None:
    say(f"SIGTERM: leaving at step {step}; the others go on")
    raise Departed(f"SIGTERM: left at step {step}; the other ranks go on")
