"""Slow pods' Warning Events: a namespace at a time, at most once per interval, and
only the jobs whose answer changed are woken (pod_warnings.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from horovod_operator.pod_warnings import SELECTOR, PodWarnings


class Events:
    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.calls: list[tuple[str, str]] = []

    async def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        self.calls.append((namespace, field_selector))
        return self.items.get(namespace, [])


def event(pod: str, reason: str, stamp: str, message: str = "m") -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "Pod", "name": pod},
        "reason": reason,
        "message": message,
        "lastTimestamp": stamp,
    }


def test_one_read_per_namespace_however_many_pods_and_jobs() -> None:
    events = Events()
    events.items["ns"] = [
        event(f"big-worker-{i}", "FailedMount", "2026-01-01T00:00:00Z") for i in range(2048)
    ]
    woken: list[tuple[str, str]] = []
    warnings = PodWarnings(events, on_change=woken.append)
    big = [f"big-worker-{i}" for i in range(2048)]
    assert warnings.want(("ns", "big"), big) == {}  # nothing read yet, no request
    assert warnings.want(("ns", "small"), ["small-worker-0"]) == {}
    assert events.calls == []
    asyncio.run(warnings.read("ns"))
    assert events.calls == [("ns", SELECTOR)]
    assert woken == [("ns", "big")]  # the small job's pod has no Warning: not woken
    found = warnings.want(("ns", "big"), big)
    assert len(found) == 2048 and found["big-worker-7"] == ("FailedMount", "m")
    # The same answer again wakes nobody.
    asyncio.run(warnings.read("ns"))
    assert woken == [("ns", "big")]


def test_the_newest_warning_of_a_pod_wins_and_others_pods_are_not_kept() -> None:
    events = Events()
    events.items["ns"] = [
        event("j-worker-0", "FailedMount", "2026-01-01T00:00:05Z", "newer"),
        event("j-worker-0", "FailedCreatePodSandBox", "2026-01-01T00:00:01Z", "older"),
        event("someone-else", "BackOff", "2026-01-01T00:00:09Z"),
    ]
    warnings = PodWarnings(events)
    warnings.want(("ns", "j"), ["j-worker-0"])
    asyncio.run(warnings.read("ns"))
    assert warnings.want(("ns", "j"), ["j-worker-0"]) == {"j-worker-0": ("FailedMount", "newer")}


def test_a_standby_reads_nothing_and_a_job_that_stops_asking_is_dropped() -> None:
    events = Events()
    leading = False
    warnings = PodWarnings(events, active=lambda: leading)
    warnings.want(("ns", "j"), ["j-worker-0"])
    asyncio.run(warnings.read("ns"))
    assert events.calls == []
    warnings.want(("ns", "j"), [])  # its pods started
    leading = True
    asyncio.run(warnings.read("ns"))
    assert events.calls == []


def test_the_reader_keeps_to_its_interval() -> None:
    events = Events()
    warnings = PodWarnings(events, interval=0.3)

    async def run() -> None:
        reader = asyncio.create_task(warnings.run())
        warnings.want(("a", "j"), ["j-worker-0"])
        warnings.want(("b", "k"), ["k-worker-0"])
        await asyncio.sleep(1.0)
        reader.cancel()

    asyncio.run(run())
    for namespace in ("a", "b"):
        reads = [c for c in events.calls if c[0] == namespace]
        assert 3 <= len(reads) <= 5, events.calls  # at 0, 0.3, 0.6, 0.9 s


def test_a_refused_read_wakes_nobody_keeps_the_last_answer_and_is_tried_again() -> None:
    from horovod_operator.kube_errors import KubeError

    events = Events()
    events.items["ns"] = [event("j-worker-0", "FailedMount", "2026-01-01T00:00:00Z")]
    woken: list[tuple[str, str]] = []
    warnings = PodWarnings(events, on_change=woken.append)
    warnings.want(("ns", "j"), ["j-worker-0"])
    asyncio.run(warnings.read("ns"))
    assert woken == [("ns", "j")]

    async def refused(namespace: str, field_selector: str) -> list[dict[str, Any]]:
        events.calls.append((namespace, field_selector))
        raise KubeError(429, "TooManyRequests", "throttled")

    events.list_events = refused  # type: ignore[method-assign]
    asyncio.run(warnings.read("ns"))
    assert woken == [("ns", "j")]
    assert warnings.want(("ns", "j"), ["j-worker-0"]) == {"j-worker-0": ("FailedMount", "m")}
    assert warnings.reads == 1 and len(events.calls) == 2
