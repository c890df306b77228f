"""Leader election on a coordination.k8s.io Lease: one active reconciler at a time.

The algorithm of client-go's leaderelection package, which every Go controller
(mpi-operator included) runs: a replica holds the Lease while it renews it;
another takes it over only after seeing the same record unchanged for a whole
lease duration, measured on its own monotonic clock (so clock skew between
nodes cannot shorten it). A leader that cannot renew within the renew deadline
steps down before its lease can expire, so two replicas never act at once.

kopf's peering was not used: it pauses operators of lower priority, but two
replicas of the same priority both keep running, and nothing bounds how long a
paused one takes to notice; it also needs its own cluster-wide CRD.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from .kube import Kube, KubeError

logger = logging.getLogger(__name__)

# client-go's defaults.
LEASE_DURATION: Final = 15.0
RENEW_DEADLINE: Final = 10.0
RETRY_PERIOD: Final = 2.0


def _micro_time(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Observed:
    record: tuple[Any, ...] | None = None
    at: float = 0.0


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = LEASE_DURATION,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.is_leader = False
        self._observed = _Observed()
        self._last_renew = 0.0

    async def run(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> None:
        """Acquire, then renew; call the callbacks on each change of leadership. Runs
        until cancelled (a leader releases nothing: its lease simply expires)."""
        try:
            while True:
                try:
                    held = await self._try_acquire_or_renew()
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    # Any failure (urllib3's MaxRetryError while the API server
                    # restarts is no OSError) only means: not renewed this round.
                    # Letting it end this loop would leave no leader at all.
                    logger.warning("leader election: %s", error)
                    held = False
                now = time.monotonic()
                if held:
                    self._last_renew = now
                    if not self.is_leader:
                        self.is_leader = True
                        logger.info("leader election: %s became the leader", self.identity)
                        on_started()
                elif self.is_leader and now - self._last_renew >= self.renew_deadline:
                    self.is_leader = False
                    logger.warning("leader election: %s lost the lease; standing by", self.identity)
                    on_stopped()
                await asyncio.sleep(self.retry_period)
        finally:
            if self.is_leader:
                self.is_leader = False
                on_stopped()

    async def _try_acquire_or_renew(self) -> bool:
        lease = await self.kube.get("Lease", self.namespace, self.name)
        now = time.monotonic()
        spec = self._spec()
        if lease is None:
            # A 409 here means another replica created it first: not ours this round.
            await self.kube.create(
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
            )
            return True
        current = lease.get("spec") or {}
        record = (
            current.get("holderIdentity"),
            current.get("renewTime"),
            current.get("leaseTransitions"),
        )
        if record != self._observed.record:
            self._observed = _Observed(record, now)
        holder = current.get("holderIdentity")
        duration = float(current.get("leaseDurationSeconds") or self.lease_duration)
        expired = now - self._observed.at >= duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(current.get("leaseTransitions") or 0)
        if holder == self.identity:
            spec["acquireTime"] = current.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = transitions
        else:
            spec["leaseTransitions"] = transitions + 1
        lease = {**lease, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec}
        try:
            await self.kube.replace(lease)
        except KubeError as error:
            if error.conflict:
                return False  # another replica wrote first
            raise
        return True

    def _spec(self) -> dict[str, Any]:
        stamp = _micro_time()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
