"""Discovery fails closed: a check that does not answer leaves the feature unknown,
asked again with backoff, and a job that needs an unknown feature waits, Stalled."""

from __future__ import annotations

import asyncio
from typing import Any

from horovod_operator.decide import decide
from horovod_operator.discovery import FEATURES, KUEUE, Discovery, Feature
from horovod_operator.kube_errors import KubeError
from tests.operator.test_decide import body, cond, created, observe


class FlakyDiscovery:
    """kube.serves: each group version fails `failures[gv]` times (a 503), then answers."""

    def __init__(self, failures: dict[str, int], served: set[str]) -> None:
        self.failures = dict(failures)
        self.served = served
        self.calls: list[str] = []

    async def serves(self, group_version: str, plural: str) -> bool:
        self.calls.append(group_version)
        if self.failures.get(group_version, 0) > 0:
            self.failures[group_version] -= 1
            raise KubeError(503, "ServiceUnavailable", "the server is currently unable")
        return group_version in self.served


def test_a_check_that_fails_is_unknown_and_asked_again_until_it_answers() -> None:
    kube = FlakyDiscovery({KUEUE.group_version: 3}, served={KUEUE.group_version})
    discovery = Discovery(kube)  # type: ignore[arg-type]
    known: list[tuple[str, bool]] = []
    slept: list[float] = []

    async def no_wait(seconds: float) -> None:
        slept.append(seconds)

    async def run() -> None:
        await discovery.check_all()
        assert discovery.served["kueue"] is None  # not "not served"
        assert "503" in discovery.errors["kueue"]
        assert {f.key for f in discovery.pending()} == {"kueue"}
        await discovery.retry(lambda f, s: known.append((f.key, s)), sleep=no_wait)

    asyncio.run(run())
    assert discovery.served == {
        "gang": False,
        "volcano": False,
        "coscheduling": False,
        "kueue": True,
    }
    assert known == [("kueue", True)] and discovery.errors == {}
    assert slept == sorted(slept) and len(slept) == 3  # backoff, growing
    assert kube.calls.count(KUEUE.group_version) == 4


def test_the_backoff_is_capped() -> None:
    kube = FlakyDiscovery({KUEUE.group_version: 12}, served=set())
    discovery = Discovery(kube, (KUEUE,))  # type: ignore[arg-type]
    slept: list[float] = []

    async def no_wait(seconds: float) -> None:
        slept.append(seconds)

    async def run() -> None:
        await discovery.check_all()
        await discovery.retry(lambda f, s: None, sleep=no_wait)

    asyncio.run(run())
    assert max(slept) == 30.0 and discovery.served["kueue"] is False


def _stalled(plan: Any) -> tuple[str, str, str]:
    return cond(plan, "Stalled")


def test_a_queued_job_is_not_created_while_kueue_is_unknown() -> None:
    job = body(scheduling={"queue": "gpus", "gang": {"policy": "None"}})
    plan = decide(observe(job, kueue_api=None, discovery_errors={"kueue": "503 Unavailable"}))
    assert created(plan) == []  # neither a Workload nor a pod outside the quota
    status, reason, message = _stalled(plan)
    assert (status, reason) == ("True", "APIDiscoveryPending")
    assert "kueue.x-k8s.io/v1beta2" in message and "503 Unavailable" in message


def test_a_default_job_waits_while_the_native_gang_is_unknown() -> None:
    plan = decide(observe(body(), gang_api=None, discovery_errors={"gang": "429 TooMany"}))
    assert created(plan) == []
    assert _stalled(plan)[1] == "APIDiscoveryPending"
    assert "scheduling.k8s.io/v1beta1" in _stalled(plan)[2]


def test_a_job_that_needs_nothing_unknown_goes_on() -> None:
    job = body(scheduling={"gang": {"policy": "None"}})
    plan = decide(observe(job, gang_api=None, kueue_api=None, volcano_api=None))
    assert "Pod/j-worker-0" in created(plan)


def test_every_feature_has_a_key_the_observation_knows() -> None:
    from horovod_operator.plan import Observation

    fields = set(Observation.__dataclass_fields__)
    assert all(isinstance(f, Feature) and f"{f.key}_api" in fields for f in FEATURES)
