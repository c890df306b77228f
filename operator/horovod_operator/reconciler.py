"""The reconcile loop of one HorovodJob: observe, compute status, write it, act.

Level-triggered: every event of a job, its pods or its launcher Job asks for a
reconcile of that job; events arriving close together are folded into one
(`batch_window`), and reconciles of one job never overlap. Each reconcile reads
the job and its children from kopf's indexes (filled from label-selected
watches before any handler runs, so a restarted operator sees everything at
once), computes the status with the pure :func:`status.compute_status`, writes
it only when it changed (conditional on resourceVersion), then acts on the
status just written. A crash between any two steps leaves a state from which
the next reconcile does the remaining steps, and fixed child names make each
creation happen once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError

from horovod_worker import contract

from . import builders, metrics, names
from .api import (
    TERMINAL_PHASES,
    HorovodJob,
    HorovodJobStatus,
    format_validation_error,
    parse_job,
)
from .kube import Kube, KubeError
from .sshkeys import generate_key_pair
from .status import (
    FAILED,
    REASON_DEADLINE,
    REASON_INVALID_SPEC,
    REASON_RESUMED,
    active_replicas,
    all_workers_ready,
    compute_status,
    format_time,
    invalid_spec_status,
    is_terminating,
    launcher_state,
    name_of,
    normalize_status,
    now_utc,
    parse_time,
    pod_phase,
    progress_only,
    role_of,
    status_body,
)

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, job name)
Obj = Mapping[str, Any]
Index = Mapping[Key, Collection[Obj]]

# How long a child we created (or deleted) is trusted to exist (or be going)
# before the watch shows it; after that the index is believed again.
PENDING_WRITE_TTL: Final = 30.0
MAX_RETRY_DELAY: Final = 60.0
# A change of progress alone (worker counters, Pending -> Starting, the launcher
# created: status.progress_only) is written at most this often per job: while
# hundreds of pods start, every batch would otherwise cost a status patch, in a
# burst those patches are what the client QPS limit spends, and for a small job
# the next write (Running) usually comes first and carries it.
PROGRESS_INTERVAL: Final = 1.0
_EVENT_PHASES: Final = frozenset({"Running", "Restarting", "Suspended", "Succeeded", "Failed"})


def _resource_version(body: Obj | None) -> int:
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


def _condition_of(status: HorovodJobStatus, type_: str) -> tuple[str, str] | None:
    for condition in status.conditions:
        if condition.type == type_ and condition.status == "True":
            return condition.reason, condition.message
    return None


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        batch_window: float = 0.05,
        clock: Callable[[], datetime] = now_utc,
        default_image: str | None = None,
    ) -> None:
        self.kube = kube
        self.batch_window = batch_window
        self.default_image = default_image
        self.clock = clock
        self.jobs: Index = {}
        self.pods: Index = {}
        self.launchers: Index = {}
        self._patched: dict[Key, Obj] = {}
        self._creating: dict[Key, dict[str, float]] = {}
        self._deleting: dict[Key, dict[str, float]] = {}
        self._ensured: dict[Key, tuple[str, int]] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._progress_timers: dict[Key, asyncio.TimerHandle] = {}
        self._last_write: dict[Key, float] = {}
        self._errors: dict[Key, int] = {}

    # --- triggering ----------------------------------------------------------------------

    def bind(self, jobs: Index, pods: Index, launchers: Index) -> None:
        """Take kopf's indexes (handed to handlers as keyword arguments)."""
        self.jobs, self.pods, self.launchers = jobs, pods, launchers

    def trigger(self, key: Key) -> None:
        """Ask for a reconcile of `key`; folded into one already waiting or running."""
        self._dirty.add(key)
        if key not in self._tasks:
            self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key))

    def _schedule(self, key: Key, delay: float) -> None:
        """Reconcile `key` again after `delay` seconds (deadline, ttl, retry)."""
        self._cancel_timer(key)
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(max(0.0, delay), self.trigger, key)

    def _cancel_timer(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def _run(self, key: Key) -> None:
        try:
            while key in self._dirty:
                await asyncio.sleep(self.batch_window)
                self._dirty.discard(key)
                started = time.monotonic()
                try:
                    await self.reconcile(key)
                    self._errors.pop(key, None)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    count = self._errors[key] = self._errors.get(key, 0) + 1
                    delay = min(MAX_RETRY_DELAY, 0.5 * 2**count)
                    metrics.RECONCILE_ERRORS.inc()
                    logger.warning(
                        "reconcile of %s/%s failed (retry in %.1fs): %s", *key, delay, error
                    )
                    self._schedule(key, delay)
                finally:
                    metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        finally:
            self._tasks.pop(key, None)

    async def shutdown(self) -> None:
        for key in list(self._timers):
            self._cancel_timer(key)
        for timer in self._progress_timers.values():
            timer.cancel()
        self._progress_timers.clear()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, key: Key) -> None:
        self._cancel_timer(key)
        progress_timer = self._progress_timers.pop(key, None)
        if progress_timer is not None:
            progress_timer.cancel()
        for store in (
            self._patched,
            self._creating,
            self._deleting,
            self._ensured,
            self._errors,
            self._last_write,
        ):
            store.pop(key, None)

    # --- observing -----------------------------------------------------------------------

    def job_body(self, key: Key) -> Obj | None:
        """The freshest body of the job: the watch's, or our own last status patch."""
        indexed = next(iter(self.jobs.get(key, ())), None)
        patched = self._patched.get(key)
        if indexed is None:
            return None
        if patched is not None:
            same_job = patched["metadata"].get("uid") == indexed["metadata"].get("uid")
            if same_job and _resource_version(patched) > _resource_version(indexed):
                return patched
            del self._patched[key]
        return indexed

    def _children(self, key: Key) -> tuple[list[Obj], Obj | None]:
        pods = list(self.pods.get(key, ()))
        launchers = list(self.launchers.get(key, ()))
        launcher = next((j for j in launchers if role_of(j) == contract.ROLE_LAUNCHER), None)
        seen = {name_of(p) for p in pods} | {name_of(j) for j in launchers}
        gone_or_going = {name_of(p) for p in pods if is_terminating(p)}
        now = time.monotonic()
        creating = self._creating.get(key, {})
        for name in [n for n, t in creating.items() if n in seen or now - t > PENDING_WRITE_TTL]:
            del creating[name]
        deleting = self._deleting.get(key, {})
        for name in [
            n
            for n, t in deleting.items()
            if n not in seen or n in gone_or_going or now - t > PENDING_WRITE_TTL
        ]:
            del deleting[name]
        return pods, launcher

    # --- the reconcile -------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        body = self.job_body(key)
        if body is None:
            self._forget(key)
            return
        if body["metadata"].get("deletionTimestamp"):
            return  # garbage collection removes the children
        now = self.clock()
        pods, launcher = self._children(key)
        try:
            job = parse_job(body, self.default_image)
        except ValidationError as error:
            await self._invalid(key, body, format_validation_error(error), now, pods, launcher)
            return
        if job.status is not None and self._spec_fixed(job):
            job = job.model_copy(update={"status": None})

        status = compute_status(job, pods, launcher, now)
        if job.status is None and status.phase == "Pending" and not pods:
            # A new job: create first and write the status once the watch shows
            # the pods (the reconcile their events trigger), which saves a status
            # write per job. Creating is idempotent, so a crash here is harmless.
            await self._act(key, body, job, status, pods, launcher, now)
            return
        written = await self._write_status(key, body, status, now)
        if written is None:
            return
        await self._act(key, written, job, status, pods, launcher, now)

    @staticmethod
    def _spec_fixed(job: HorovodJob) -> bool:
        """A job failed for an invalid spec whose spec changed since: start it afresh."""
        assert job.status is not None
        failed = _condition_of(job.status, FAILED)
        return (
            failed is not None
            and failed[0] == REASON_INVALID_SPEC
            and job.status.observed_generation != job.metadata.generation
        )

    async def _write_status(
        self, key: Key, body: Obj, status: HorovodJobStatus, now: datetime
    ) -> Obj | None:
        """Patch the status when it changed; the body to act on, None on a conflict."""
        old = body.get("status") or {}
        new = status_body(status)
        stored = normalize_status(old)
        if new == stored:
            return body
        if self._defer_progress(key, new, stored):
            return body
        patch: dict[str, Any] = {k: None for k in old if k not in new}
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
            fresh = await self.kube.get_job(meta["namespace"], meta["name"])
            if fresh is not None:
                self._patched[key] = fresh
                self.trigger(key)
            return None
        self._patched[key] = written
        self._last_write[key] = time.monotonic()
        await self._announce(written, old, status, now)
        return written

    def _defer_progress(self, key: Key, new: Obj, stored: Obj) -> bool:
        """True when only progress changed and the last write is too recent; a
        reconcile is then scheduled for when the progress may be written."""
        if not progress_only(stored, new):
            return False
        wait = self._last_write.get(key, -PROGRESS_INTERVAL) + PROGRESS_INTERVAL
        wait -= time.monotonic()
        if wait <= 0:
            return False
        if key not in self._progress_timers:
            loop = asyncio.get_running_loop()

            def fire() -> None:
                self._progress_timers.pop(key, None)
                self.trigger(key)

            self._progress_timers[key] = loop.call_later(wait, fire)
        return True

    async def _announce(self, body: Obj, old: Obj, status: HorovodJobStatus, now: datetime) -> None:
        """Metrics for each phase transition, and an Event for each that users act on.

        Pending and Starting get no Event (the status shows them), which keeps a
        job's start at workers + 4 creates (Secret, ConfigMap, Service, workers,
        launcher Job), a status patch or two and the Running Event.
        """
        before, after = old.get("phase"), status.phase
        if before == after or after is None:
            return
        reason, message, warning = self._describe(status)
        if before == "Suspended":
            reason, message = REASON_RESUMED, "the job is resumed"
        if before is None and reason != REASON_INVALID_SPEC:
            metrics.JOBS_CREATED.inc()
        if after == "Succeeded":
            metrics.JOBS_SUCCEEDED.inc()
        elif after == "Failed":
            metrics.JOBS_FAILED.labels(reason=reason).inc()
        elif after == "Restarting":
            metrics.JOB_RESTARTS.inc()
        logger.info(
            "job %s/%s: %s -> %s (%s) %s",
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            before,
            after,
            reason,
            message,
        )
        if after in _EVENT_PHASES or before == "Suspended":
            await self.kube.post_event(
                body, "Warning" if warning else "Normal", reason, message, format_time(now)
            )

    @staticmethod
    def _describe(status: HorovodJobStatus) -> tuple[str, str, bool]:
        phase = status.phase or "Pending"
        condition = (
            _condition_of(status, phase)
            if phase in ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
            else None
        )
        if condition is not None:
            return condition[0], condition[1], phase in ("Restarting", "Failed")
        counts = status.workers
        replicas = counts.replicas if counts else 0
        if phase == "Starting":
            return (
                "WorkersRunning",
                f"{replicas} worker pod(s) running; starting the launcher",
                False,
            )
        return "Pending", f"creating or waiting for {replicas} worker pod(s)", False

    # --- acting --------------------------------------------------------------------------

    async def _act(
        self,
        key: Key,
        body: Obj,
        job: HorovodJob,
        status: HorovodJobStatus,
        pods: list[Obj],
        launcher: Obj | None,
        now: datetime,
    ) -> None:
        phase = status.phase
        if phase in ("Pending", "Starting", "Running"):
            await self._ensure_children(key, body, job, status, pods, launcher, now)
        elif phase in ("Restarting", "Suspended"):
            self._ensured.pop(key, None)  # the next attempt or the resume checks them again
            await self._delete_children(key, pods, launcher, lambda pod: True, True)
        elif phase in TERMINAL_PHASES:
            await self._finish(key, job, status, pods, launcher, now)
            return
        self._schedule_deadline(key, job, status, now)

    async def _ensure_children(
        self,
        key: Key,
        body: Obj,
        job: HorovodJob,
        status: HorovodJobStatus,
        pods: list[Obj],
        launcher: Obj | None,
        now: datetime,
    ) -> None:
        replicas = active_replicas(job.model_copy(update={"status": status}))
        if replicas != job.spec.worker.replicas:
            worker = job.spec.worker.model_copy(update={"replicas": replicas})
            job = job.model_copy(update={"spec": job.spec.model_copy(update={"worker": worker})})
        attempt = status.restarts
        uid = job.metadata.uid
        if self._ensured.get(key) != (uid, attempt):
            await asyncio.gather(
                self._create(key, builders.new_ssh_secret(job, generate_key_pair())),
                self._ensure_config_map(builders.new_config_map(job)),
                self._create(key, builders.new_worker_service(job)),
            )
            self._ensured[key] = (uid, attempt)

        existing = {name_of(p) for p in pods if role_of(p) == contract.ROLE_WORKER}
        creating = self._creating.get(key, {})
        missing = [
            i
            for i in range(replicas)
            if names.worker_name(job.metadata.name, i) not in existing
            and names.worker_name(job.metadata.name, i) not in creating
        ]
        results = await asyncio.gather(
            *(self._create(key, builders.new_worker_pod(job, i, attempt)) for i in missing),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, KubeError) and result.invalid:
                await self._reject(key, body, "spec.worker.template", "worker pod", result, now)
                return
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if missing:
            return  # the launcher waits for the watch to show the workers

        policy = job.spec.run_policy.launcher_creation_policy
        launcher_name = names.launcher_name(job.metadata.name)
        if (
            launcher is None
            and launcher_name not in creating
            and (policy == "AtStartup" or all_workers_ready(status))
        ):
            try:
                await self._create(key, builders.new_launcher_job(job, attempt))
            except KubeError as error:
                if not error.invalid:
                    raise
                await self._reject(key, body, "spec.launcher.template", "launcher Job", error, now)

    async def _ensure_config_map(self, config_map: dict[str, Any]) -> None:
        """Create the ConfigMap, or bring an existing one's hostfile up to date.

        A job resumed with another replica count, or restarted after a change of
        slotsPerWorker, needs the new hostfile; a read first keeps the common
        case (nothing changed) free of writes.
        """
        if await self.kube.create(config_map) is not None:
            return
        meta = config_map["metadata"]
        current = await self.kube.get("ConfigMap", meta["namespace"], meta["name"])
        if current is not None and current.get("data") != config_map["data"]:
            await self.kube.merge_patch(
                "ConfigMap", meta["namespace"], meta["name"], {"data": config_map["data"]}
            )

    async def _create(self, key: Key, obj: dict[str, Any]) -> None:
        await self.kube.create(obj)
        if obj["kind"] in ("Pod", "Job"):
            self._creating.setdefault(key, {})[obj["metadata"]["name"]] = time.monotonic()

    async def _delete_children(
        self,
        key: Key,
        pods: list[Obj],
        launcher: Obj | None,
        select: Callable[[Obj], bool],
        with_launcher: bool,
    ) -> None:
        """Delete the selected worker pods (and the launcher Job) not already going."""
        ns = key[0]
        deleting = self._deleting.setdefault(key, {})
        targets = [
            ("Pod", name_of(p))
            for p in pods
            if role_of(p) == contract.ROLE_WORKER and not is_terminating(p) and select(p)
        ]
        if with_launcher and launcher is not None and not is_terminating(launcher):
            targets.append(("Job", name_of(launcher)))
        targets = [(kind, name) for kind, name in targets if name not in deleting]
        for _, name in targets:
            deleting[name] = time.monotonic()
        await asyncio.gather(*(self.kube.delete(kind, ns, name) for kind, name in targets))

    async def _finish(
        self,
        key: Key,
        job: HorovodJob,
        status: HorovodJobStatus,
        pods: list[Obj],
        launcher: Obj | None,
        now: datetime,
    ) -> None:
        """cleanPodPolicy, then ttlSecondsAfterFinished."""
        failed = _condition_of(status, FAILED)
        policy = job.spec.run_policy
        if failed is not None and failed[0] in (REASON_DEADLINE, REASON_INVALID_SPEC):
            # Like a batch/v1 Job past its deadline: nothing of it keeps running.
            await self._delete_children(key, pods, launcher, lambda pod: True, True)
        elif policy.clean_pod_policy == "All":
            await self._delete_children(key, pods, launcher, lambda pod: True, True)
        elif policy.clean_pod_policy == "Running":
            state = launcher_state(pods, launcher, status.restarts)
            launcher_active = state is not None and state.phase in ("Pending", "Running")
            await self._delete_children(
                key,
                pods,
                launcher,
                lambda pod: pod_phase(pod) in ("Pending", "Running"),
                launcher_active,
            )

        ttl = policy.ttl_seconds_after_finished
        if ttl is not None and status.completion_time:
            due = parse_time(status.completion_time) + timedelta(seconds=ttl)
            if now >= due:
                logger.info("job %s/%s: ttlSecondsAfterFinished passed, deleting it", *key)
                await self.kube.delete_job(*key)
            else:
                self._schedule(key, (due - now).total_seconds() + 0.5)
        else:
            self._cancel_timer(key)

    def _schedule_deadline(
        self, key: Key, job: HorovodJob, status: HorovodJobStatus, now: datetime
    ) -> None:
        deadline = job.spec.run_policy.active_deadline_seconds
        if deadline is None or status.start_time is None or status.phase == "Suspended":
            return
        due = parse_time(status.start_time) + timedelta(seconds=deadline)
        self._schedule(key, (due - now).total_seconds() + 0.5)

    # --- invalid specs -------------------------------------------------------------------

    async def _invalid(
        self,
        key: Key,
        body: Obj,
        message: str,
        now: datetime,
        pods: list[Obj],
        launcher: Obj | None,
    ) -> None:
        """Failed/InvalidSpec: an Event, no children, no retries until the spec changes."""
        previous: HorovodJobStatus | None
        try:
            previous = HorovodJobStatus.model_validate(body.get("status") or {})
        except ValidationError:
            previous = None
        generation = int(body["metadata"].get("generation") or 0)
        if previous is not None and (
            previous.phase == "Succeeded"
            or (previous.phase == "Failed" and previous.observed_generation == generation)
        ):
            status = previous  # finished, or already reported for this generation
        else:
            status = invalid_spec_status(previous, message, generation, now)
        if await self._write_status(key, body, status, now) is None:
            return
        await self._delete_children(key, pods, launcher, lambda pod: True, True)

    async def _reject(
        self, key: Key, body: Obj, field: str, what: str, error: KubeError, now: datetime
    ) -> None:
        """The API server refused a child built from the user's template."""
        message = f"{field}: the API server rejected the {what}: {error.message}"
        logger.warning("job %s/%s: %s", *key, message)
        previous = parse_job(body, self.default_image).status
        generation = int(body["metadata"].get("generation") or 0)
        status = invalid_spec_status(previous, message, generation, now)
        written = await self._write_status(key, body, status, now)
        if written is None:
            return
        # Nothing half-way: remove what this attempt created so far.
        pods, launcher = self._children(key)
        await self._delete_children(key, pods, launcher, lambda pod: True, True)
        name = body["metadata"]["name"]
        created_pods = [n for n in self._creating.get(key, {}) if n.startswith(f"{name}-worker-")]
        await asyncio.gather(
            *(self.kube.delete("Pod", key[0], n) for n in created_pods),
            self.kube.delete("Secret", key[0], names.secret_name(name)),
            self.kube.delete("ConfigMap", key[0], names.config_name(name)),
            self.kube.delete("Service", key[0], names.service_name(name)),
        )
        self._ensured.pop(key, None)
