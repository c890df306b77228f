"""What the decision function reads and what it returns: plain data, no behaviour."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .api import HorovodJobSpec, HorovodJobStatus
from .children import Children
from .claims import WorkerClaims
from .refusals import permanent
from .sshkeys import KeyPair

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Refusal:
    """The API server refused to create a child (kept by the executor until the
    create succeeds, the child appears, or the job's generation changes)."""

    kind: str
    name: str
    code: int
    message: str
    generation: int = 0
    role: str | None = None  # worker or launcher, for pods and the launcher Job

    @property
    def permanent(self) -> bool:
        return permanent(self.code)


@dataclass(frozen=True)
class Observation:
    """Everything :func:`horovod_operator.decide.decide` reads."""

    body: Obj  # the HorovodJob as stored
    children: Children
    now: datetime
    refusals: Sequence[Refusal] = ()
    # Warning Events of pods that wait to start without a reason in their status
    # (FailedMount only shows there): pod name -> (reason, message).
    pod_warnings: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # The spec this job last ran with, for an edit that fails validation later, and
    # its raw form with its generation (kept in the ConfigMap: accepted.py).
    accepted_spec: HorovodJobSpec | None = None
    accepted_raw: tuple[int, Obj] | None = None
    default_image: str | None = None
    # Fresh key pairs (client and host), given when the job's SSH Secret does not exist.
    keys: KeyPair | None = None
    host_key: KeyPair | None = None
    # Seconds a pod may stay terminating past its deletion time (its grace period)
    # before the operator deletes it with grace period 0: its node is gone.
    stuck_pod_grace: float = 60.0
    # The opt-in template policy (--restrict-templates): see validation.py.
    restrict_templates: bool = False
    # Whether this operator reads rank 0's log (progress.py; --no-first-step-metric
    # turns it off): without it no progress deadline can fire.
    reads_logs: bool = True
    # What the cluster serves (discovery.py); None: its check has not answered yet,
    # and a job that needs it waits (fail closed).
    # scheduling.k8s.io/v1beta1 PodGroup (native gang scheduling).
    gang_api: bool | None = False
    # kueue.x-k8s.io/v1beta2 Workload: a job with a queue is admitted by Kueue as one
    # Workload (queueing.py).
    kueue_api: bool | None = False
    # Volcano's scheduling.volcano.sh/v1beta1 PodGroup, and scheduler-plugins'
    # scheduling.x-k8s.io/v1alpha1 PodGroup (podgroups.py).
    volcano_api: bool | None = False
    coscheduling_api: bool | None = False
    # The last error of each check that has not answered (discovery.Feature.key).
    discovery_errors: Mapping[str, str] = field(default_factory=dict)
    # The ResourceFlavors the job's admitted Workload names, by name.
    flavors: Mapping[str, Obj] = field(default_factory=dict)
    # What spec.scheduling.priorityClassName names, looked up while the job has no
    # Workload yet; None when it names nothing (or is unset).
    priority: Priority | None = None
    # What the worker's DRA claims add up to (claims.py); None: it names no
    # ResourceClaimTemplate, or the job is finished.
    worker_claims: WorkerClaims | None = None


@dataclass(frozen=True)
class Priority:
    """A priority class as a Workload refers to it (spec.priorityClassRef, spec.priority)."""

    group: str  # kueue.x-k8s.io (WorkloadPriorityClass) or scheduling.k8s.io (PriorityClass)
    kind: str
    name: str
    value: int


@dataclass(frozen=True)
class WorkloadStatusPatch:
    """A write of the job's Workload status, as Kueue's job framework makes for its
    own jobs: conditions (the whole list) and, when clearing, no admission."""

    name: str
    resource_version: str
    conditions: list[dict[str, Any]]
    clear_admission: bool = False
    summary: str = ""  # for the log: what the write says


@dataclass(frozen=True)
class WorkloadAdoption:
    """Make the job the controller of a Workload it did not create (MultiKueue's, on
    a worker cluster: multikueue.py), conditional on the version read."""

    name: str
    resource_version: str
    owner: Obj  # the job's controller ownerReference


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    # The launcher Job goes in the foreground: it stays (terminating) until its
    # pod is gone, so "no launcher Job" also means "no launcher pod".
    propagation: str = "Background"
    # 0 removes a pod stuck terminating on a lost node; the executor then posts
    # `warning` as an Event (once per delete it sends).
    grace_period: int | None = None
    warning: str | None = None
    # The UID of the object this view saw: the delete is conditional on it, so a
    # same-name object made meanwhile (the user re-applied, another attempt) is kept.
    uid: str = ""


@dataclass(frozen=True)
class PodSweep:
    """The `Delete`s of several of a job's worker pods as one request: a DELETE of
    the pods its labels select (and, with `field_selector`, only those not finished).
    A job's end costs one write instead of one per worker, and its client's rate
    limit is not spent for seconds on a big job's deletes while other jobs wait."""

    label_selector: str
    field_selector: str  # "" selects every phase
    names: tuple[str, ...]  # the pods this view expects it to delete
    uids: tuple[str, ...] = ()  # theirs, for one-by-one deletes if the sweep is refused


@dataclass
class Plan:
    """What to do, in this order: write the status, post the events, delete, create."""

    status: HorovodJobStatus | None = None  # None: leave the status as it is
    events: list[Event] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    sweeps: list[PodSweep] = field(default_factory=list)
    creates: list[dict[str, Any]] = field(default_factory=list)
    config_data: dict[str, str] | None = None  # new data of the job's ConfigMap
    # New annotations of the job's ConfigMap: the spec now accepted (accepted.py).
    config_annotations: dict[str, str] | None = None
    delete_job: bool = False  # ttlSecondsAfterFinished passed
    requeue_after: float | None = None
    accepted_spec: HorovodJobSpec | None = None  # remember this spec as accepted
    workload_status: WorkloadStatusPatch | None = None
    workload_adopt: WorkloadAdoption | None = None
