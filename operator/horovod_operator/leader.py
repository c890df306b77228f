"""Leader election on a coordination.k8s.io Lease: one active reconciler at a time.

The algorithm of client-go's leaderelection package, which every Go controller
(mpi-operator included) runs: a replica holds the Lease while it renews it;
another takes it over only after seeing the same record unchanged for a whole
lease duration, measured on its own monotonic clock (so clock skew between
nodes cannot shorten it). A leader that cannot renew within the renew deadline
steps down before its lease can expire, so two replicas never act at once.

What makes that hold under load and pauses:
- the elector has a client of its own (no rate limit shared with the
  reconciler's creates, no retries, no request longer than the renew deadline),
  and each round is cut off when the renew deadline would pass, so a slow or
  throttled API server makes a leader step down in time instead of hanging in
  a renew while its lease expires;
- :meth:`LeaderElector.holds` is the fence: the reconciler's client asks it
  before every write, in the thread that sends it, so a leader paused past its
  deadline (SIGSTOP, a stalled node) sends nothing when it resumes until it has
  renewed again;
- a clean shutdown releases the Lease (client-go's ReleaseOnCancel): the
  standby takes over at its next retry, about a second, not a lease later.

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

from .kube import Kube
from .kube_errors import KubeError

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

    def holds(self) -> bool:
        """Whether this replica may act now: it leads, and its last renew is within the
        renew deadline (so its lease has not expired for anyone else)."""
        return self.is_leader and time.monotonic() - self._last_renew < self.renew_deadline

    def _round_budget(self) -> float:
        """How long this round's calls may take: a leader's must end before its renew
        deadline passes; a candidate's are bounded by the deadline too."""
        if not self.is_leader:
            return self.renew_deadline
        return max(0.0, self._last_renew + self.renew_deadline - time.monotonic())

    async def run(self, on_started: Callable[[], None], on_stopped: Callable[[], None]) -> None:
        """Acquire, then renew; call the callbacks on each change of leadership. Runs
        until cancelled; a leader then releases the Lease."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self._round_budget()):
                        held = await self._try_acquire_or_renew()
                except asyncio.CancelledError:
                    raise
                except TimeoutError:
                    logger.warning(
                        "leader election: no answer within the renew deadline (%.0fs)",
                        self.renew_deadline,
                    )
                    held = False
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
                still_held = self.holds()
                self.is_leader = False
                on_stopped()
                if still_held:
                    await self._release()

    async def _release(self) -> None:
        """Hand the Lease back (an empty holder, a one-second duration), as client-go's
        ReleaseOnCancel does, if it is still ours: the standby takes it at once."""
        try:
            async with asyncio.timeout(self.retry_period):
                lease = await self.kube.get("Lease", self.namespace, self.name)
                spec = (lease or {}).get("spec") or {}
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return
                stamp = _micro_time()
                released = {
                    **spec,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                }
                body = {**lease, "apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
                await self.kube.replace({**body, "spec": released})
            logger.info("leader election: %s released the lease", self.identity)
        except Exception as error:  # its lease then simply expires
            logger.warning("leader election: releasing the lease failed: %s", error)

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
