"""Why a pod is slow to start: the newest Warning Event of each pod that waits on its
node (FailedMount, FailedCreatePodSandBox, ...), read a namespace at a time on a
budget of its own.

Such a pod says why only in its Events. They used to be read pod by pod, inside the
reconcile, on the request budget that creates, status writes and the job's other
work share: a 2,048-worker job on a silent node cost 2,048 LISTs every 10 s, one
reconcile took over 40 s, every other job waited for tokens, and /healthz turned
red. Now a reconcile only says which of its job's pods it wants explained (`want`,
no request); one task (`run`) reads each such namespace's Pod Warning Events at most
once per `interval`, on the client's diagnostics budget (rate_limit.DIAGNOSTIC_QPS), keeps
the newest per wanted pod, and wakes the jobs whose answer changed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from .memory import Key

logger = logging.getLogger(__name__)

INTERVAL: Final = 10.0  # seconds between two reads of one namespace
SELECTOR: Final = "involvedObject.kind=Pod,type=Warning"

Warning = tuple[str, str]  # (reason, message)


class EventReader(Protocol):
    async def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]: ...


@dataclass
class _Namespace:
    read_at: float = -math.inf
    wanted: dict[Key, frozenset[str]] = field(default_factory=dict)
    newest: dict[str, Warning] = field(default_factory=dict)  # wanted pods only
    given: dict[Key, dict[str, Warning]] = field(default_factory=dict)  # what each job got


class PodWarnings:
    def __init__(
        self,
        kube: EventReader,
        on_change: Callable[[Key], None] = lambda key: None,
        active: Callable[[], bool] = lambda: True,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.on_change = on_change
        self.active = active
        self.interval = interval
        self.clock = clock
        self.reads = 0  # namespace reads made (tests, the benchmark)
        self._namespaces: dict[str, _Namespace] = {}
        self._wake = asyncio.Event()

    def want(self, key: Key, pods: Collection[str]) -> dict[str, Warning]:
        """The newest Warning known of each of `pods` (job `key`'s pods slow to start:
        all of them, each call replaces the last); no request. A job whose wanted pods
        gain a newer Warning is woken (on_change) after the next read of its namespace."""
        namespace = self._namespaces.get(key[0])
        if not pods:
            if namespace is not None:
                namespace.wanted.pop(key, None)
                namespace.given.pop(key, None)
                if not namespace.wanted:
                    del self._namespaces[key[0]]
            return {}
        if namespace is None:
            namespace = self._namespaces[key[0]] = _Namespace()
        wanted = frozenset(pods)
        if not wanted <= namespace.wanted.get(key, frozenset()):
            self._wake.set()  # a pod not asked for before: the reader looks at its dues
        namespace.wanted[key] = wanted
        found = {pod: namespace.newest[pod] for pod in wanted if pod in namespace.newest}
        namespace.given[key] = found
        return found

    def forget(self, key: Key) -> None:
        self.want(key, ())

    async def run(self) -> None:
        """Read each namespace with wanted pods once per interval, one after another."""
        while True:
            for name in [n for n, ns in self._namespaces.items() if self._due(ns)]:
                await self.read(name)
            self._wake.clear()
            dues = [ns.read_at + self.interval for ns in self._namespaces.values()]
            timeout = max(0.05, min(dues) - self.clock()) if dues else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _due(self, namespace: _Namespace) -> bool:
        return bool(namespace.wanted) and self.clock() - namespace.read_at >= self.interval

    async def read(self, name: str) -> None:
        """One LIST of the namespace's Pod Warning Events; wakes the jobs whose answer
        changed. A replica that does not lead reads nothing (its jobs are not acted on)."""
        namespace = self._namespaces.get(name)
        if namespace is None:
            return
        namespace.read_at = self.clock()
        if not self.active():
            return
        try:
            events = await self.kube.list_events(name, SELECTOR)
        except Exception as error:  # a diagnosis is never worth failing over
            logger.debug("cannot read the pod Warning Events of %s: %s", name, error)
            return
        self.reads += 1
        namespace.read_at = self.clock()
        wanted = set().union(*namespace.wanted.values())
        stamps: dict[str, str] = {}
        newest: dict[str, Warning] = {}
        for event in events:
            pod = str((event.get("involvedObject") or {}).get("name") or "")
            if pod not in wanted:
                continue
            stamp = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if pod not in stamps or stamp >= stamps[pod]:
                stamps[pod] = stamp
                newest[pod] = (
                    str(event.get("reason") or "Warning"),
                    str(event.get("message") or ""),
                )
        namespace.newest = newest
        for key, pods in list(namespace.wanted.items()):
            found = {pod: newest[pod] for pod in pods if pod in newest}
            if found != namespace.given.get(key, {}):
                self.on_change(key)
