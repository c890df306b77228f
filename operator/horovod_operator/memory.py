"""What the executor keeps about each job between reconciles, and the watched objects.

All of it may be lost in a restart: the next decision rebuilds it from the
cluster at the cost of a request or two.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .kinds import HOROVOD_JOB, ApiKind
from .plan import Refusal

Key = tuple[str, str]  # (namespace, job name)
Obj = Mapping[str, Any]
Index = Mapping[Key, Collection[Obj]]

# A change of progress alone (worker counters, Pending -> Starting, the launcher
# created: status_writing.progress_only) is written at most this often per job: while
# hundreds of pods start, every batch would otherwise cost a status patch.
PROGRESS_INTERVAL: Final = 1.0


@dataclass
class Refused:
    refusal: Refusal
    count: int
    retry_at: float


@dataclass
class JobMemory:
    """What the executor keeps about one job (one UID) between reconciles."""

    uid: str = ""
    creating: dict[str, float] = field(default_factory=dict)
    deleting: dict[str, float] = field(default_factory=dict)
    # The launcher Job as its create answered, until the watch shows it: the watch of
    # Jobs can lag behind the watch of Pods, and its pods would look stray meanwhile
    # (their Job gone: a restart for LauncherDeleted).
    launcher: Obj | None = None
    refused: dict[str, Refused] = field(default_factory=dict)
    # (generation, raw spec) of the spec last accepted: a started job whose edit is
    # invalid keeps running on it (observing.Observer._accepted_spec parses it when needed).
    accepted: tuple[int, Obj] | None = None
    patched: Obj | None = None
    last_write: float = -PROGRESS_INTERVAL
    deferred: bool = False  # a progress-only status change waits for its interval
    warnings_due: float | None = None  # when a waiting pod becomes slow to start
    # Launcher pods seen disrupted (Children.launcher_disruptions), a few at most.
    launcher_disruptions: dict[str, str] = field(default_factory=dict)
    # The PodGroup whose predecessors are deleted (applying.Applier._retire_earlier_groups).
    group: str = ""
    # The job's SSH Secret (views.slim_owned; None: none), as last read or written:
    # Secrets are not watched (observing.Observer._secret). `secret_read`: it is known.
    secret: Obj | None = None
    secret_read: bool = False

    def unseen_launcher(self, indexed: Collection[Obj]) -> Obj | None:
        """The launcher Job this operator created that the watch does not show yet (for
        observing.PENDING_WRITE_TTL at most, as any pending create), so that its pods are told
        apart by its UID meanwhile; None once the watch shows it or the wait is over."""
        launcher = self.launcher
        if launcher is None:
            return None
        name = launcher["metadata"]["name"]
        if name not in self.creating or any(o["metadata"]["name"] == name for o in indexed):
            self.launcher = None
            return None
        return launcher


@dataclass
class Indexes:
    """The watched objects (watches.Store) by (namespace, job name), under the name of
    their kind (kinds.ApiKind.kind): a kind watched later (Workloads, once Kueue is
    known to be served) shows here as soon as its store is in `by_kind`."""

    by_kind: Mapping[str, Index] = field(default_factory=dict)

    def of(self, kind: ApiKind) -> Index:
        return self.by_kind.get(kind.kind) or {}

    @property
    def jobs(self) -> Index:
        return self.of(HOROVOD_JOB)

    def children(self, key: Key) -> dict[str, Collection[Obj]]:
        """Every watched child of the job `key`, by kind (children.sort_children's input)."""
        return {
            kind: index.get(key, ())
            for kind, index in self.by_kind.items()
            if kind != HOROVOD_JOB.kind
        }
