"""Write a job's status: the diff against the stored status, the throttle on
progress-only changes (memory.PROGRESS_INTERVAL), the patch conditional on the
resourceVersion that was observed, and the metrics of each phase transition. Also the
job's Kueue Workload status, which the operator writes for Kueue's PodsReady."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from . import metrics, names
from .api import STARTING_PHASES, TERMINAL_PHASES, HorovodJobStatus, parse_status
from .conditions import CREATED, now_utc, parse_time
from .kube import Kube
from .kube_errors import KubeError
from .memory import PROGRESS_INTERVAL, JobMemory, Key, Obj
from .plan import WorkloadStatusPatch

logger = logging.getLogger(__name__)

_KNOWN_STATUS_KEYS: Final = frozenset(
    field.alias or name for name, field in HorovodJobStatus.model_fields.items()
)


class StaleView(Exception):
    """A status write conflicted: reconcile again from the server's object."""


class StatusWriter:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def write(
        self, key: Key, body: Obj, status: HorovodJobStatus, memory: JobMemory
    ) -> Obj | None:
        """Patch the status when it changed; the body to act on, None on a conflict."""
        old = body.get("status") or {}
        new = status_body(status)
        stored = {k: v for k, v in normalized(old).items() if k in _KNOWN_STATUS_KEYS}
        memory.deferred = False
        if new == stored:
            return body
        if progress_only(stored, new) and time.monotonic() - memory.last_write < PROGRESS_INTERVAL:
            memory.deferred = True  # written when the interval has passed, if still true
            return body
        patch: dict[str, Any] = {k: None for k in stored if k not in new}
        patch.update(new)
        meta = body["metadata"]
        try:
            written = await self.kube.patch_job_status(
                meta["namespace"], meta["name"], meta.get("resourceVersion"), patch
            )
        except KubeError as error:
            if error.not_found:
                return None
            if not error.conflict:
                raise
            # Our view was stale: start over from the server's current object.
            memory.patched = await self.kube.get_job(meta["namespace"], meta["name"])
            raise StaleView() from error
        memory.patched = written
        memory.last_write = time.monotonic()
        _count_transition(key, old.get("phase"), status)
        return written

    async def write_workload(self, namespace: str, patch: WorkloadStatusPatch) -> bool:
        """Write the job's Workload status; True when Kueue moved it meanwhile (409)."""
        status: dict[str, Any] = {"conditions": patch.conditions}
        if patch.clear_admission:
            status["admission"] = None
        try:
            await self.kube.patch_status(
                "Workload", namespace, patch.name, patch.resource_version, status
            )
        except KubeError as error:
            if error.not_found:
                return False
            if error.conflict:
                return True
            raise
        logger.info("workload %s/%s: %s", namespace, patch.name, patch.summary)
        return False


def normalized(raw: Obj) -> dict[str, Any]:
    """A stored status in the form status_body gives, to compare them."""
    parsed = parse_status(dict(raw)) if raw else None
    return status_body(parsed) if parsed is not None else {}


def _count_transition(key: Key, before: str | None, status: HorovodJobStatus) -> None:
    after = status.phase
    if before == after or after is None:
        return
    if before is None and status.reason != "InvalidSpec":
        metrics.JOBS_CREATED.inc()
    metrics.PHASES.set(key, after)
    if after == "Succeeded":
        metrics.JOBS_SUCCEEDED.inc()
    elif after == "Failed":
        metrics.JOBS_FAILED.labels(reason=status.reason or "Unknown").inc()
    elif after == "Restarting":
        metrics.JOB_RESTARTS.inc()
    elif after == "Running" and status.attempt_start_time:
        waited = (now_utc() - parse_time(status.attempt_start_time)).total_seconds()
        metrics.TIME_TO_RUNNING.labels(namespace=key[0]).observe(max(0.0, waited))
    if after in TERMINAL_PHASES and status.start_time and status.completion_time:
        took = parse_time(status.completion_time) - parse_time(status.start_time)
        metrics.JOB_DURATION.labels(namespace=key[0], phase=after).observe(
            max(0.0, took.total_seconds())
        )
    logger.info(
        "job %s/%s: %s -> %s (%s) %s",
        *key,
        before,
        after,
        status.reason,
        status.message,
        extra=names.log_fields(*key),
    )


# --- comparing statuses ------------------------------------------------------------------

# How far a start has got: worker counters, the launcher's own phase, Pending ->
# Starting, the Created condition and the waiting reason. The reconciler may
# hold a change of these alone for a moment, since a later change (Running, a
# failure) often supersedes it.
_PROGRESS_KEYS: Final = frozenset(
    {"workers", "launcher", "phase", "conditions", "reason", "message"}
)


def progress_only(stored: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when two status bodies (as status_body makes them) differ only in progress.

    A first status (nothing stored) and every change of phase other than Pending
    <-> Starting, of any condition but Created, of restarts, failures or times are
    not progress: users and the operator's own next step wait for those.
    """
    if not stored:
        return False
    phases = {stored.get("phase"), new.get("phase")}
    if len(phases) > 1 and not phases <= STARTING_PHASES:
        return False
    for key in set(stored) | set(new):
        if stored.get(key) == new.get(key):
            continue
        if key not in _PROGRESS_KEYS:
            return False
        if key == "conditions" and _other_conditions(stored) != _other_conditions(new):
            return False
    return True


def _other_conditions(status: Mapping[str, Any]) -> list[Any]:
    return [c for c in status.get("conditions") or () if c.get("type") != CREATED]


def status_body(status: HorovodJobStatus) -> dict[str, Any]:
    """The status as the API stores it (camelCase, no nulls)."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")
