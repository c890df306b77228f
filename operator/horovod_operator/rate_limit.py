"""The client's token buckets (kube.Kube): the QPS and burst of the children's requests,
a second bucket of the same size for the HorovodJobs' own, and the smaller budget
of the describing reads."""

from __future__ import annotations

import asyncio
import time
from typing import Final

# The budget of the describing reads (Kube._diagnostics: rank 0's log, slow pods'
# Events), beside the client QPS/burst that creates and status writes share.
DIAGNOSTIC_QPS: Final = 5.0
DIAGNOSTIC_BURST: Final = 10


class RateLimiter:
    """Token bucket: `qps` requests per second on average, `burst` at once."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.qps)
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.qps)
