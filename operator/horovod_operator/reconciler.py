"""The work queue: which job to reconcile when, and one reconcile = observe, decide, act.

Level-triggered: every event of a job or of a child asks for a reconcile of
that job. A job is reconciled at once, then at most once per window
(`batch_window`, longer for a job of many pods: `window`), which folds the
events that arrive meanwhile into one pass; reconciles of one job never
overlap. A change its status shows at once (its launcher's: `hurry`) ends the
window's wait. Each reconcile reads the job and its children from the
watches' stores (watches.py: listed before anything is reconciled, so a
restarted operator sees everything at once), asks the pure
:func:`~.decide.decide` for a plan, and has the :class:`~.executor.Executor`
carry it out. A crash between any two steps leaves a state from which the
next reconcile does the remaining steps; fixed child names and ownership make
each creation happen once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Final

from . import kinds, metrics, names
from .decide import decide
from .executor import Executor
from .kube import Kube
from .kube_errors import KubeError
from .memory import Key
from .observing import ObserveSettings, Sources
from .pod_state import pod_phase, pod_ready
from .status_writing import StaleView

logger = logging.getLogger(__name__)

# Errors (not refusals: those are the executor's) are retried after 0.5, 1, 2,
# ... seconds, at most this.
MAX_RETRY_DELAY: Final = 60.0
# Jobs triggered per event-loop iteration when all are (a takeover, the first sync).
TRIGGER_CHUNK: Final = 100
FINISHED: Final = ("Succeeded", "Failed")
# A pass reads every pod of its job, so while many of its pods are still to start
# (to be created, scheduled, Ready) its window grows with them past this many, up to
# MAX_WINDOW: at 512 workers the passes every 0.05 s while the pods started were more
# than half of the operator's CPU (py-spy, 2026-12-07). It shrinks back as they start,
# so the pass that sees the last worker Ready (and creates the launcher) waits no
# longer than a small job's would; a window of 0.4 s to the end put the launcher 0.3 s
# behind the tuned mpi-operator's at 512 workers. The launcher's changes skip it
# (hurry), and progress is written at most once a second anyway.
WINDOW_PODS: Final = 64
MAX_WINDOW: Final = 0.5


def retry_delay(errors: int) -> float:
    """Capped exponential backoff; the exponent is bounded, so no overflow."""
    return float(min(MAX_RETRY_DELAY, 0.5 * 2 ** min(errors, 16)))


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        batch_window: float = 0.05,
        settings: ObserveSettings | None = None,
        active: bool = True,
        synced: bool = True,
        sources: Sources | None = None,
    ) -> None:
        self.kube = kube
        self.batch_window = batch_window
        self.executor = Executor(kube, settings, sources)
        # False on a standby replica: events are noted, nothing is reconciled.
        self.active = active
        # False until the watches have listed every kind once (watches.py): a job
        # decided from a partial view could create children that already exist.
        self.synced = synced
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._errors: dict[Key, int] = {}
        self._started: dict[Key, float] = {}  # reconciles in flight, since when
        self._last_pass: dict[Key, float] = {}  # when each job's last reconcile ended
        self._spreading: asyncio.Task[None] | None = None  # trigger_all's triggers
        self._urgent: set[Key] = set()  # jobs whose next pass waits for no window
        self._wakers: dict[Key, asyncio.Future[None]] = {}  # jobs waiting out a window
        self._to_spread: dict[Key, None] = {}  # the keys it has still to trigger, in order

    # --- triggering ----------------------------------------------------------------------

    def trigger(self, key: Key) -> None:
        """Ask for a reconcile of `key`; folded into one already waiting or running.
        A standby keeps nothing per job (its set of keys once grew with every job it
        heard of, and the new leader paid for it at once): taking over, it
        reconciles every job in its indexes anyway (activate)."""
        if not self.active:
            return
        self._dirty.add(key)
        if self.synced and key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key))

    def hurry(self, key: Key) -> None:
        """A change the job's status shows at once (its launcher's pod or Job): its next
        pass waits for no batch window. At 8 workers the window put Running 0.06 s
        after the launcher's pod existed, against the tuned mpi-operator's 0.03 s
        (docs/benchmarks, 2026-12-04); the workers' events still fold."""
        if not self.active:
            return
        self._urgent.add(key)
        waker = self._wakers.get(key)
        if waker is not None and not waker.done():
            waker.set_result(None)

    def mark_synced(self) -> None:
        """Every watched kind has been listed: reconcile what asked meanwhile."""
        self.synced = True
        self._trigger_spread(list(self._dirty))

    def activate(self) -> None:
        """This replica leads: reconcile every job it knows (the standby's indexes are
        warm, so the new leader starts from a complete view at once)."""
        self.active = True
        self.trigger_all()

    def trigger_all(self) -> None:
        """Reconcile every job known (leadership gained, a cluster feature now known)."""
        self._trigger_spread([*self.executor.indexes.jobs.keys(), *self._dirty])

    def _trigger_spread(self, keys: list[Key]) -> None:
        """Trigger `keys` TRIGGER_CHUNK at a time, one loop iteration apart. All at once,
        10,000 jobs' reconciles were ready together and asyncio ran them all before any
        timer or socket: a takeover blocked the loop (Lease renewals, /healthz) 0.8 s.
        A spread under way takes the new keys too: cancelling it for the new ones lost
        its own when leadership and the first full listing came in one loop iteration."""
        self._to_spread.update(dict.fromkeys(keys))
        if self._spreading is None or self._spreading.done():
            self._spreading = asyncio.get_running_loop().create_task(self._trigger_each())

    async def _trigger_each(self) -> None:
        while self._to_spread:
            chunk = list(itertools.islice(self._to_spread, TRIGGER_CHUNK))
            for key in chunk:
                del self._to_spread[key]
                self.trigger(key)
            await asyncio.sleep(0)

    def pending(self) -> int:
        """Jobs waiting for a reconcile (a standby: none)."""
        return len(self._dirty)

    def deactivate(self) -> None:
        """Leadership lost: stop at once; the new leader observes from scratch."""
        self.active = False
        if self._spreading is not None:
            self._spreading.cancel()
        self._to_spread.clear()
        self._dirty.clear()
        self._urgent.clear()
        for key in list(self._timers):
            self._cancel_timer(key)
        for task in list(self._tasks.values()):
            task.cancel()
        self.executor.memory.clear()

    def stalled_for(self) -> float:
        """Seconds the longest reconcile in flight has run (0 when none)."""
        if not self._started:
            return 0.0
        return time.monotonic() - min(self._started.values())

    def _schedule(self, key: Key, delay: float | None) -> None:
        """Reconcile `key` again after `delay` seconds (deadline, TTL, retry), or never."""
        self._cancel_timer(key)
        if delay is not None:
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_later(max(0.0, delay), self.trigger, key)

    def _cancel_timer(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def _run(self, key: Key) -> None:
        try:
            while key in self._dirty:
                # Leading edge: a job not reconciled within the window is reconciled at
                # once (a new job's first pass waits for nothing); one that was waits
                # out the window, folding what arrives meanwhile into one pass.
                last = self._last_pass.get(key)
                wait = 0.0 if last is None else last + self.window(key) - time.monotonic()
                if wait > 0 and key not in self._urgent:
                    await self._wait_window(key, wait)
                else:
                    await asyncio.sleep(0)  # triggers of this same tick fold into this pass
                self._urgent.discard(key)
                self._dirty.discard(key)
                started = self._started[key] = time.monotonic()
                try:
                    self._schedule(key, await self.reconcile(key))
                    self._errors.pop(key, None)
                except StaleView:
                    self._dirty.add(key)  # the server had a newer job: decide again
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    count = self._errors[key] = self._errors.get(key, 0) + 1
                    delay = retry_delay(count)
                    metrics.RECONCILE_ERRORS.inc()
                    logger.warning(
                        "reconcile of %s/%s failed (retry in %.1fs): %s",
                        *key,
                        delay,
                        error,
                        extra=names.log_fields(*key),
                        # Anything but the API's answer is a bug of ours: its traceback.
                        exc_info=not isinstance(error, KubeError),
                    )
                    self._schedule(key, delay)
                finally:
                    self._started.pop(key, None)
                    ended = time.monotonic()
                    metrics.RECONCILE_SECONDS.observe(ended - started)
                    if key in self.executor.indexes.jobs:
                        self._last_pass[key] = ended
                    else:
                        self._last_pass.pop(key, None)
        finally:
            self._tasks.pop(key, None)

    def window(self, key: Key) -> float:
        """The job's batch window: `batch_window`, longer while many of its pods are
        still to start (one look at each pod, against the pass's many)."""
        indexes = self.executor.indexes
        pods = indexes.of(kinds.POD).get(key, ())
        jobs = indexes.jobs.get(key, ())
        spec = (next(iter(jobs), None) or {}).get("spec") or {}
        wanted = _int((spec.get("worker") or {}).get("replicas")) + 1  # and the launcher
        if max(wanted, len(pods)) <= WINDOW_PODS:
            return self.batch_window
        started = sum(1 for pod in pods if pod_ready(pod) or pod_phase(pod) in FINISHED)
        to_start = max(wanted, len(pods)) - started
        scaled = self.batch_window * max(1.0, to_start / WINDOW_PODS)
        return min(scaled, max(self.batch_window, MAX_WINDOW))

    async def _wait_window(self, key: Key, seconds: float) -> None:
        """Sleep `seconds`, or less if `hurry(key)` comes first (asyncio.sleep's own
        future and timer, with the timer's end reachable from outside)."""
        loop = asyncio.get_running_loop()
        waker: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, waker)
        self._wakers[key] = waker
        try:
            await waker
        finally:
            timer.cancel()
            self._wakers.pop(key, None)

    async def shutdown(self) -> None:
        if self._spreading is not None:
            self._spreading.cancel()
        for key in list(self._timers):
            self._cancel_timer(key)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one reconcile -------------------------------------------------------------------

    async def reconcile(self, key: Key) -> float | None:
        """Observe, decide, act; the seconds after which to look again, if any."""
        observed = await self.executor.observe(key, time.monotonic())
        if observed is None:
            self._errors.pop(key, None)
            return None
        seen, memory = observed
        plan = decide(seen)
        return await self.executor.execute(key, seen.body, plan, memory)


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


def _int(value: object) -> int:
    """A count from a job's raw spec (validated later, by the pass itself)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
