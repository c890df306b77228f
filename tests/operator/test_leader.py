"""Leader election on a Lease, over an in-memory API that checks resourceVersions."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from horovod_operator.kube_errors import KubeError
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
        self.unreachable: set[str] = set()  # task names whose requests fail
        self.hang = False  # every get waits for ever (a request with no answer)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        task = asyncio.current_task()
        reader = task.get_name() if task is not None else ""
        self.readers.append(reader)
        if self.failure is not None:
            raise self.failure
        if reader in self.unreachable:
            raise OSError("network unreachable")
        if self.hang:
            await asyncio.sleep(3600)
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
        api.unreachable.add("a")  # a dies, cut off: it cannot release
        task_a.cancel()
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
    assert api.lease["spec"]["holderIdentity"] == ""  # b released it as it stopped
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


def test_a_clean_shutdown_releases_the_lease_and_the_standby_takes_it_at_once() -> None:
    api = LeaseApi()
    a, b = elector(api, "a", duration=3.0), elector(api, "b", duration=3.0)
    b_started: list[float] = []

    async def run() -> None:
        task_a = asyncio.create_task(a.run(lambda: None, lambda: None), name="a")
        await wait_for(lambda: a.is_leader, 2, "a leads")
        task_b = asyncio.create_task(
            b.run(lambda: b_started.append(time.monotonic()), lambda: None), name="b"
        )
        await wait_for(lambda: "b" in api.readers, 2, "b reads the lease")
        stopped = time.monotonic()
        task_a.cancel()  # SIGTERM: kopf's cleanup cancels the elector
        await asyncio.gather(task_a, return_exceptions=True)
        assert api.lease is not None and api.lease["spec"]["holderIdentity"] == ""
        await wait_for(lambda: b.is_leader, 2, "b takes over")
        # At its next retry (0.1 s), not after the 3 s lease.
        assert b_started[0] - stopped < 1.0
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)

    asyncio.run(run())


def test_a_renew_with_no_answer_is_cut_off_and_the_leader_steps_down_in_time() -> None:
    """A throttled or hung API server: the round is cut at the renew deadline,
    so the leader stops before its lease can expire for anyone else."""
    api = LeaseApi()
    a = elector(api, "a")
    stepped_down: list[float] = []

    async def run() -> None:
        task = asyncio.create_task(
            a.run(lambda: None, lambda: stepped_down.append(time.monotonic())), name="a"
        )
        await wait_for(lambda: a.is_leader, 2, "a leads")
        api.hang = True
        cut = a._last_renew
        await wait_for(lambda: stepped_down, 2, "a steps down")
        assert stepped_down[0] - cut < 0.6  # the lease duration
        assert not a.holds()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


def test_the_fence_closes_at_the_renew_deadline_even_before_the_loop_notices() -> None:
    """A leader paused past its deadline (SIGSTOP) resumes with is_leader still set;
    its writes are refused all the same until it has renewed again."""
    api = LeaseApi()
    a = elector(api, "a")

    async def run() -> None:
        task = asyncio.create_task(a.run(lambda: None, lambda: None), name="a")
        await wait_for(lambda: a.is_leader, 2, "a leads")
        assert a.holds()
        a._last_renew -= a.renew_deadline  # as after a pause of the whole process
        assert a.is_leader and not a.holds()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
