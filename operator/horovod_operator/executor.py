"""The reconciler's hands: observe a job (observing.Observer builds the decision's
input), carry out the decision's plan (applying.Applier), and write the job's status
(status_writing.StatusWriter, which the applier calls first). decide.py, between
observing and applying, is pure.
"""

from __future__ import annotations

from .applying import Applier
from .kube import Kube
from .memory import Indexes, JobMemory, Key, Obj
from .observing import Observer, ObserveSettings, Sources
from .plan import Observation, Plan
from .status_writing import StatusWriter


class Executor:
    def __init__(
        self, kube: Kube, settings: ObserveSettings | None = None, sources: Sources | None = None
    ) -> None:
        self.kube = kube
        self.observer = Observer(kube, settings, sources)
        self.status = StatusWriter(kube)
        self.applier = Applier(kube, self.observer, self.status)

    # The watch's indexes (replaced whole by tests).
    @property
    def indexes(self) -> Indexes:
        return self.observer.indexes

    @indexes.setter
    def indexes(self, indexes: Indexes) -> None:
        self.observer.indexes = indexes

    @property
    def memory(self) -> dict[Key, JobMemory]:
        return self.observer.memory

    def job_body(self, key: Key) -> Obj | None:
        return self.observer.job_body(key)

    def forget(self, key: Key) -> None:
        self.observer.forget(key)

    async def observe(self, key: Key, now_s: float) -> tuple[Observation, JobMemory] | None:
        return await self.observer.observe(key, now_s)

    async def execute(self, key: Key, body: Obj, plan: Plan, memory: JobMemory) -> float | None:
        """Carry out `plan`; the seconds after which to look again, if any."""
        return await self.applier.execute(key, body, plan, memory)
