"""Leader election on a Lease, over an in-memory API that checks resourceVersions."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from horovod_operator.kube import KubeError
from horovod_operator.leader import LeaderElector


class LeaseApi:
    """get/create/replace of one Lease with optimistic concurrency, like the API server."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
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

    async def run() -> None:
        task_a = asyncio.create_task(a.run(lambda: log.append("a+"), lambda: log.append("a-")))
        await asyncio.sleep(0.3)
        task_b = asyncio.create_task(b.run(lambda: log.append("b+"), lambda: log.append("b-")))
        await asyncio.sleep(1.0)  # a renews: b never leads
        assert (a.is_leader, b.is_leader) == (True, False)
        task_a.cancel()  # a dies without releasing
        await asyncio.gather(task_a, return_exceptions=True)
        log.append("a died")
        await asyncio.sleep(0.35)
        assert not b.is_leader  # the lease has not expired yet by b's clock
        await asyncio.sleep(0.8)
        assert b.is_leader
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
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(a.run(lambda: None, lambda: stepped_down.append(loop.time())))
        await asyncio.sleep(0.3)
        assert a.is_leader

        async def unreachable(*_: Any) -> None:
            raise OSError("connection refused")

        api.get = unreachable  # type: ignore[method-assign]
        cut = loop.time()
        await asyncio.sleep(0.8)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert stepped_down and stepped_down[0] - cut < 0.6  # within the lease duration

    asyncio.run(run())


def test_any_error_of_the_api_layer_only_skips_a_round() -> None:
    """urllib3's MaxRetryError (no OSError) once ended the loop: no leader was left."""
    api = LeaseApi()
    a = elector(api, "a")
    real_get = api.get

    async def run() -> None:
        task = asyncio.create_task(a.run(lambda: None, lambda: None))
        await asyncio.sleep(0.3)

        async def restarting(*_: Any) -> None:
            raise RuntimeError("Max retries exceeded (the API server restarts)")

        api.get = restarting  # type: ignore[method-assign]
        await asyncio.sleep(0.3)
        assert not task.done()
        api.get = real_get  # type: ignore[method-assign]
        await asyncio.sleep(0.3)
        assert a.is_leader and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
