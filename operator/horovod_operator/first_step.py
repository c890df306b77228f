"""Time to the first training step: when rank 0 starts training, read from its log.

Rank 0 prints `HVJOB_RANK rank=0 ...` (horovod_contract.RANK_PREFIX) once Horovod is
initialised and the initial state is broadcast, right before its first step: the
built-in trainers do, and a user's script can print the same line. For a Running
job without status.firstStepTime, the watcher reads the start of the log where
rank 0's output lands: the launcher's (horovodrun collects every rank's output,
mpi) or worker 0's (gloo: rank 0 runs there). Once found it writes
status.firstStepTime (the line's kubelet timestamp, else when it was read), posts
a TrainingStarted Event and observes horovod_operator_job_time_to_first_step_seconds
from the job's creation: what a user waits for after `kubectl apply`.

Costs: one GET of at most LIMIT_BYTES per Running job that has not started
training, first after MIN_INTERVAL, then less often (up to MAX_INTERVAL). A job
whose log passes LIMIT_BYTES without the line (a script that never prints it) is
not read again. Only the leader reads.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import horovod_contract as contract

from . import metrics, names
from .conditions import format_time, now_utc, parse_time
from .kube import Kube, KubeError
from .memory import Indexes, Key

logger = logging.getLogger(__name__)

Obj = dict[str, Any]

# Rank 0's line comes within the first few KiB (framework warnings before it).
LIMIT_BYTES: Final = 256 * 1024
MIN_INTERVAL: Final = 2.0
MAX_INTERVAL: Final = 30.0
REASON_TRAINING_STARTED: Final = "TrainingStarted"
_FINISHED: Final = ("Succeeded", "Failed")

# Anywhere in a line: horovodrun prefixes each rank's output ("[1,0]<stdout>:").
_RANK0: Final = re.compile(rf"{re.escape(contract.RANK_PREFIX)} rank=0 ")
# What `timestamps=true` puts first on each line: RFC 3339 with nanoseconds.
_STAMP: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?Z ")


def find_first_step(log: str) -> tuple[bool, str | None]:
    """(whether rank 0's start line is in `log`, its timestamp if the line has one)."""
    for line in log.splitlines():
        if _RANK0.search(line):
            stamp = _STAMP.match(line)
            return True, f"{stamp.group(1)}Z" if stamp else None
    return False, None


# An elastic job's rank 0 is on the first worker its launcher found Ready, which
# is not always worker 0: at most this many workers' logs are read per look.
ELASTIC_CANDIDATES: Final = 4


def rank0_sources(
    body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str | None]]:
    """The (pod, container) logs that may hold rank 0's output, in the order to read
    them: the launcher's (mpi), worker 0's (gloo: rank 0 runs there), or for an
    elastic job the Running workers of the attempt by index (rank 0 starts on the
    lowest-index worker Horovod's driver found Ready, elastic_launcher.py; only
    that one prints rank 0's line)."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    attempt = str(status.get("restarts") or 0)

    def labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
        return pod["metadata"].get("labels") or {}

    if spec.get("elastic"):
        workers = sorted(
            (
                p
                for p in pods
                if labels(p).get(names.LABEL_ATTEMPT) == attempt
                and labels(p).get(names.LABEL_ROLE) == names.ROLE_WORKER
                and (p.get("status") or {}).get("phase") in ("Running", "Succeeded")
            ),
            key=lambda p: (_index(labels(p).get(names.LABEL_WORKER_INDEX)), p["metadata"]["name"]),
        )
        chosen = workers[:ELASTIC_CANDIDATES]
        role = names.ROLE_WORKER
    elif spec.get("launchMode") == "gloo":
        wanted, role = names.worker_name(body["metadata"]["name"], 0), names.ROLE_WORKER
        chosen = [
            p
            for p in pods
            if p["metadata"]["name"] == wanted and labels(p).get(names.LABEL_ATTEMPT) == attempt
        ][:1]
    else:
        wanted = str((status.get("launcher") or {}).get("podName") or "")
        role = names.ROLE_LAUNCHER
        chosen = [p for p in pods if p["metadata"]["name"] == wanted][:1]
    sources = []
    for pod in chosen:
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or ()]
        container = role if role in containers else (containers[0] if containers else None)
        sources.append((str(pod["metadata"]["name"]), container))
    return sources


@dataclass
class _Watch:
    uid: str
    due: float
    delay: float = MIN_INTERVAL
    done: bool = False


class FirstStepWatcher:
    """Reads rank 0's log of Running jobs until it has started training."""

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
        self._watches: dict[Key, _Watch] = {}

    async def run(self) -> None:
        while True:
            if self._active():
                try:
                    await self.scan(time.monotonic())
                except Exception:  # a bug here must not stop the operator's other work
                    logger.exception("first-step watcher: scan failed")
            await asyncio.sleep(self.tick)

    async def scan(self, now_s: float) -> None:
        indexes = self._indexes()
        for key, bodies in list(indexes.jobs.items()):
            body = next(iter(bodies), None)
            if body is None:
                continue
            status = body.get("status") or {}
            uid = str(body["metadata"].get("uid") or "")
            watch = self._watches.get(key)
            if watch is not None and watch.uid != uid:
                watch = None
            phase = status.get("phase")
            if status.get("firstStepTime") or phase not in ("Running", *_FINISHED):
                self._watches.pop(key, None)
                continue
            if phase in _FINISHED:
                # A short job can finish between two looks: one last look at the
                # log of a job that was being watched (its pods are still there).
                self._watches.pop(key, None)
                if watch is not None and not watch.done:
                    pods = list(indexes.pods.get(key, ()))
                    await self._look(key, body, pods, watch, now_s, final=True)
                continue
            if watch is None:
                watch = self._watches[key] = _Watch(uid=uid, due=now_s)
            if watch.done or now_s < watch.due:
                continue
            await self._look(key, body, list(indexes.pods.get(key, ())), watch, now_s)
        for key in set(self._watches) - set(indexes.jobs.keys()):
            del self._watches[key]

    async def _look(
        self,
        key: Key,
        body: Mapping[str, Any],
        pods: list[Mapping[str, Any]],
        watch: _Watch,
        now_s: float,
        final: bool = False,
    ) -> None:
        watch.due = now_s + watch.delay
        watch.delay = min(MAX_INTERVAL, watch.delay * 1.5)
        found, stamp = False, None
        sources = rank0_sources(body, pods)
        full = []  # logs read to the limit without the line
        for pod, container in sources:
            try:
                log = await self.kube.pod_log(key[0], pod, container, LIMIT_BYTES)
            except KubeError as error:
                # Not started yet (400), gone (404), or no access: look again later.
                logger.debug("first-step watcher: log of %s/%s: %s", key[0], pod, error)
                continue
            found, stamp = find_first_step(log)
            if found:
                break
            if len(log.encode()) >= LIMIT_BYTES:
                full.append(pod)
        if not found:
            if sources and len(full) == len(sources):
                watch.done = True
                logger.info(
                    "job %s/%s: no '%s rank=0' line in the first %d KiB of %s; "
                    "time to first step not measured",
                    *key,
                    contract.RANK_PREFIX,
                    LIMIT_BYTES // 1024,
                    ", ".join(f"{pod}'s log" for pod in full),
                    extra=names.log_fields(*key),
                )
            return
        watch.done = True
        if stamp is None and final:
            # Read after the job finished, with no timestamp on the line: "now"
            # would be after the end. Not measured rather than wrong.
            return
        await self._record(key, body, stamp or format_time(now_utc()))

    async def _record(self, key: Key, body: Mapping[str, Any], stamp: str) -> None:
        meta = body["metadata"]
        try:
            await self.kube.patch_job_status(key[0], key[1], None, {"firstStepTime": stamp})
        except KubeError as error:
            if error.not_found:
                return
            raise
        created = meta.get("creationTimestamp")
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


def _index(label: str | None) -> int:
    """A worker's index label as a number; one that is not (a pod labelled by hand)
    sorts last instead of stopping the scan of every job."""
    try:
        return int(label or "")
    except ValueError:
        return sys.maxsize
