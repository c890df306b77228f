"""Prometheus metrics and the /healthz, /readyz, /metrics HTTP endpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
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
