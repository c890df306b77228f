"""Prometheus metrics and the /healthz, /readyz, /metrics HTTP endpoints."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

REGISTRY: Final = CollectorRegistry(auto_describe=True)

JOBS_CREATED: Final = Counter(
    "horovod_operator_jobs_created", "HorovodJobs first seen and started.", registry=REGISTRY
)
JOBS_SUCCEEDED: Final = Counter(
    "horovod_operator_jobs_succeeded", "HorovodJobs that succeeded.", registry=REGISTRY
)
JOBS_FAILED: Final = Counter(
    "horovod_operator_jobs_failed", "HorovodJobs that failed.", ["reason"], registry=REGISTRY
)
JOB_RESTARTS: Final = Counter(
    "horovod_operator_job_restarts", "Restarts of HorovodJobs after a failure.", registry=REGISTRY
)
RECONCILE_SECONDS: Final = Histogram(
    "horovod_operator_reconcile_duration_seconds",
    "Time spent in one reconcile of one HorovodJob.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
RECONCILE_ERRORS: Final = Counter(
    "horovod_operator_reconcile_errors",
    "Reconciles that raised and were retried.",
    registry=REGISTRY,
)
API_REFUSALS: Final = Counter(
    "horovod_operator_api_refusals",
    "Creates of a job's children refused by the API server (quota, policy, conflicts).",
    ["kind", "code"],
    registry=REGISTRY,
)
API_REQUESTS: Final = Counter(
    "horovod_operator_api_requests",
    "Kubernetes API requests made by the reconciler.",
    ["verb", "kind"],
    registry=REGISTRY,
)

LOOP_LAG: Final = Histogram(
    "horovod_operator_event_loop_lag_seconds",
    "How late a 0.1 s timer of the operator's event loop fired: time the loop was "
    "blocked (by a reconcile's CPU, a large watch list, a takeover).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
LOOP_LAG_MAX: Final = Gauge(
    "horovod_operator_event_loop_lag_max_seconds",
    "The longest the event loop was blocked since the process started.",
    registry=REGISTRY,
)


LOOP_LAG_MAX_CPU: Final = Gauge(
    "horovod_operator_event_loop_lag_max_cpu_seconds",
    "CPU the process spent during its longest event-loop block. Near the block's "
    "length: the operator's own work held the loop (a reconcile, a list, a garbage "
    "collection). Far below it: the process waited for a core the machine did not have.",
    registry=REGISTRY,
)
GC_PAUSE_MAX: Final = Gauge(
    "horovod_operator_gc_pause_max_seconds",
    "The longest garbage collection since the process started: a full one walks "
    "every object the process keeps (the watches' views of thousands of pods).",
    registry=REGISTRY,
)


class _GcPauses:
    """Times each of Python's garbage collections (gc.callbacks): one that blocks the
    loop shows as a long one here."""

    def __init__(self) -> None:
        self.began = 0.0
        self.worst = 0.0

    def __call__(self, phase: str, _info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self.began = now
        elif now - self.began > self.worst:
            self.worst = now - self.began
            GC_PAUSE_MAX.set(self.worst)


async def measure_loop_lag(interval: float = 0.1) -> None:
    """Sleep `interval` again and again and record how late each wake-up was, with
    what the process spent of CPU meanwhile, and time the garbage collections."""
    timer = _GcPauses()
    gc.callbacks.append(timer)
    loop = asyncio.get_running_loop()
    worst = 0.0
    try:
        while True:
            began, cpu = loop.time(), time.process_time()
            await asyncio.sleep(interval)
            lag = max(0.0, loop.time() - began - interval)
            LOOP_LAG.observe(lag)
            if lag > worst:
                worst = lag
                LOOP_LAG_MAX.set(lag)
                LOOP_LAG_MAX_CPU.set(time.process_time() - cpu)
    finally:
        gc.callbacks.remove(timer)


JOBS: Final = Gauge(
    "horovod_operator_jobs",
    "HorovodJobs the operator knows, by namespace and phase (Pending before a first status).",
    ["namespace", "phase"],
    registry=REGISTRY,
)
CRD_OUTDATED: Final = Gauge(
    "horovod_operator_crd_outdated_fields",
    "Schema fields of this operator's HorovodJob CRD that the installed CRD lacks "
    "(checked at start; 0: up to date). Fix: apply the chart's crds/ of this version.",
    registry=REGISTRY,
)
# Seconds: from seconds (a warm cluster, images present) to an hour (a queue, a pull).
_WAIT_BUCKETS: Final = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
TIME_TO_RUNNING: Final = Histogram(
    "horovod_operator_job_time_to_running_seconds",
    "From an attempt's start (creation, or the restart) until every worker and the launcher run.",
    ["namespace"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
TIME_TO_FIRST_STEP: Final = Histogram(
    "horovod_operator_job_time_to_first_step_seconds",
    "From a job's creation until rank 0 starts its first training step (its HVJOB_RANK line).",
    ["namespace"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
# Per Running job that reports progress (progress.py); the labels go when it stops.
JOB_SAMPLES_PER_SECOND: Final = Gauge(
    "horovod_operator_job_samples_per_second",
    "The whole job's training samples per second, from rank 0's latest HVJOB_PROGRESS line.",
    ["namespace", "job"],
    registry=REGISTRY,
)
JOB_SECONDS_SINCE_PROGRESS: Final = Gauge(
    "horovod_operator_job_seconds_since_progress",
    "Seconds since rank 0 last reported a new step (compare runPolicy.progressDeadlineSeconds).",
    ["namespace", "job"],
    registry=REGISTRY,
)
JOB_DURATION: Final = Histogram(
    "horovod_operator_job_duration_seconds",
    "From a job's start until it Succeeded or Failed, restarts included.",
    ["namespace", "phase"],
    buckets=(10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600),
    registry=REGISTRY,
)


class PhaseTracker:
    """Feeds the JOBS gauge: each job counted once, under its latest phase."""

    def __init__(self, gauge: Gauge = JOBS) -> None:
        self._gauge = gauge
        self._phases: dict[tuple[str, str], str] = {}

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        phase = phase or "Pending"
        before = self._phases.get(key)
        if before == phase:
            return
        if before is not None:
            self._gauge.labels(namespace=key[0], phase=before).dec()
        self._gauge.labels(namespace=key[0], phase=phase).inc()
        self._phases[key] = phase

    def drop(self, key: tuple[str, str]) -> None:
        before = self._phases.pop(key, None)
        if before is not None:
            self._gauge.labels(namespace=key[0], phase=before).dec()


PHASES: Final = PhaseTracker()


def count_request(verb: str, kind: str) -> None:
    API_REQUESTS.labels(verb=verb, kind=kind).inc()


class HealthServer:
    """Liveness (the event loop answers and no reconcile hangs), readiness
    (watching started), metrics."""

    def __init__(self, port: int, stalled: Callable[[], bool] = lambda: False) -> None:
        self.port = port
        self.ready = False
        self.stalled = stalled
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host="0.0.0.0", port=self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        if self.stalled():
            # A reconcile hangs (a half-open connection past every timeout): let
            # the kubelet restart the operator.
            return web.Response(status=500, text="reconciles stalled\n")
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="starting\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )
