"""Leader election on a Lease, over an in-memory API that checks resourceVersions."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from horovod_operator.kube import KubeError
from horovod_operator.leader import LeaderElector
from tests.support.aio import holds, wait_for


class LeaseApi:
    """get/create/replace of one Lease with optimistic concurrency, like the API server.
    `readers` names the task of each get; while `failure` is set, every get raises it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.readers: list[str] = []
        self.failure: Exception | None = None

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        task = asyncio.current_task()
        self.readers.append(task.get_name() if task is not None else "")
        if self.failure is not None:
            raise self.failure
        return copy.deepcopy(self.lease)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.lease is not None:
            raise KubeError(409, "AlreadyExists", "exists")
        return self._store(obj)

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.lease is not None
        if obj["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        return self._store(obj)

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(obj)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def elector(api: LeaseApi, identity: str, duration: float = 0.6) -> LeaderElector:
    return LeaderElector(
        api,  # type: ignore[arg-type]
        "ns",
        "op",
        identity,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=0.1,
    )


def test_one_leader_and_a_takeover_only_after_the_lease_expires() -> None:
    api = LeaseApi()
    a, b = elector(api, "a"), elector(api, "b")
    log: list[str] = []
    b_started: list[float] = []

    def b_leads() -> None:
        log.append("b+")
        b_started.append(time.monotonic())

    async def run() -> None:
        task_a = asyncio.create_task(
            a.run(lambda: log.append("a+"), lambda: log.append("a-")), name="a"
        )
        await wait_for(lambda: a.is_leader, 2, "a leads")
        task_b = asyncio.create_task(b.run(b_leads, lambda: log.append("b-")), name="b")
        await wait_for(lambda: "b" in api.readers, 2, "b reads the lease")
        renewals = api.version
        # Longer than a lease duration: a renews, b stands by.
        await holds(lambda: a.is_leader and not b.is_leader, 1.0, "a leads, b stands by")
        assert api.version > renewals and not task_b.done()
        task_a.cancel()  # a dies without releasing
        await asyncio.gather(task_a, return_exceptions=True)
        log.append("a died")
        died = time.monotonic()
        await wait_for(lambda: b.is_leader, 2, "b takes over")
        # Not before the record it saw last stood unchanged for a lease duration by its
        # own clock: a renewed at most one retry period (0.1 s) before it died.
        assert b_started[0] - died >= 0.35
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)

    asyncio.run(run())
    assert log == ["a+", "a-", "a died", "b+", "b-"]
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_expires() -> None:
    api = LeaseApi()
    a = elector(api, "a")
    stepped_down: list[float] = []

    async def run() -> None:
        task = asyncio.create_task(
            a.run(lambda: None, lambda: stepped_down.append(time.monotonic()))
        )
        await wait_for(lambda: a.is_leader, 2, "a leads")
        api.failure = OSError("connection refused")
        cut = time.monotonic()
        await wait_for(lambda: stepped_down, 2, "a steps down")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert stepped_down[0] - cut < 0.6  # within the lease duration

    asyncio.run(run())


def test_any_error_of_the_api_layer_only_skips_a_round() -> None:
    """urllib3's MaxRetryError (no OSError) once ended the loop: no leader was left."""
    api = LeaseApi()
    a = elector(api, "a")

    async def run() -> None:
        task = asyncio.create_task(a.run(lambda: None, lambda: None))
        await wait_for(lambda: a.is_leader, 2, "a leads")
        reads = len(api.readers)
        api.failure = RuntimeError("Max retries exceeded (the API server restarts)")
        # A round after the one that met the error: the loop went on.
        await wait_for(lambda: len(api.readers) >= reads + 2, 2, "a second round with the error")
        assert not task.done()
        api.failure = None
        renewals = api.version
        await wait_for(lambda: api.version > renewals, 2, "a renews again")
        assert a.is_leader and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
