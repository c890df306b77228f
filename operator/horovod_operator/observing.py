"""Observe: the decision's input (plan.Observation) for one job, built from the watch's
indexes and the few objects that are read by name instead of watched (the job's SSH
Secret, Kueue's ResourceFlavors and priority classes, DRA claim templates), each
cached or read only while it can matter.

What the decision function cannot know lives here too, per job (memory.JobMemory):
which children were just created or deleted and are not in the watch yet, what the
API server refused, the spec the job last ran with. All of it can be lost in a
restart: the next decision rebuilds it from the cluster, at the cost of a request or
two.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Final

from . import accepted, claims, kinds, metrics, multikueue, names, queueing, sshkeys, views
from .api import TERMINAL_PHASES, HorovodJobSpec, manager_of
from .children import Children, name_of, sort_children, uid_of, workload_finished
from .conditions import now_utc, parse_time
from .discovery import Discovery
from .kube import Kube
from .kube_errors import KubeError
from .memory import Indexes, JobMemory, Key, Obj
from .plan import Observation, Priority
from .pod_state import disruption_of, waiting_to_start
from .pod_warnings import PodWarnings, Warning
from .refusals import refused

logger = logging.getLogger(__name__)

# How long a child we created (or deleted) is trusted to exist (or be going)
# before the watch shows it; after that the index is believed again.
PENDING_WRITE_TTL: Final = 30.0
# A pod scheduled this long ago and still creating its containers without a
# reason in its status is explained by its newest Warning Event (FailedMount shows
# only there; pod_warnings.py reads them).
SLOW_START_SECONDS: Final = 15.0
# A ResourceFlavor read for one job's admission serves others for this long.
FLAVOR_TTL: Final = 30.0
# A ResourceClaimTemplate read for a job serves its later reconciles (and its
# namespace's other jobs) this long; a missing one is asked for again each time.
# Read only while the job may create pods: one GET per template per interval.
CLAIM_TEMPLATE_TTL: Final = 10.0


def _resource_version(body: Obj | None) -> int:
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


@dataclass(frozen=True)
class ObserveSettings:
    """The operator's settings that go into every Observation (settings.py's flags)."""

    default_image: str | None = None  # --default-image: a job without spec.image
    # --stuck-pod-grace: seconds past its grace period before a lost node's pod is forced.
    stuck_pod_grace: float = 60.0
    restrict_templates: bool = False  # --restrict-templates
    reads_logs: bool = True  # off with --no-first-step-metric
    # DeviceClasses whose devices count as GPUs (--gpu-device-classes, claims.py).
    gpu_device_classes: tuple[str, ...] = claims.DEFAULT_GPU_DEVICE_CLASSES


@dataclass
class Sources:
    """What the observer reads besides its own requests, made before it (handlers.startup)
    and handed in: the watches' indexes; what the cluster serves (None while its check
    has not answered, and in tests of the executor alone: then nothing optional is
    served); slow pods' Warning Events (a reader that is never run knows none)."""

    indexes: Indexes = field(default_factory=Indexes)
    discovery: Discovery | None = None
    pod_warnings: PodWarnings | None = None


class Observer:
    def __init__(
        self, kube: Kube, settings: ObserveSettings | None = None, sources: Sources | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings or ObserveSettings()
        sources = sources or Sources()
        self._claim_templates: dict[tuple[str, str], tuple[float, Obj]] = {}
        self._left: set[Key] = set()  # jobs left to another controller, logged once
        self.indexes = sources.indexes
        self.memory: dict[Key, JobMemory] = {}
        self.discovery = sources.discovery
        self._flavors: dict[str, tuple[float, Obj]] = {}
        self.pod_warnings = sources.pod_warnings or PodWarnings(kube)

    def forget(self, key: Key) -> None:
        self.memory.pop(key, None)
        self._left.discard(key)
        self.pod_warnings.forget(key)
        metrics.PHASES.drop(key)

    def job_body(self, key: Key) -> Obj | None:
        """The freshest body of the job: the watch's, or our own last status patch."""
        indexed = next(iter(self.indexes.jobs.get(key, ())), None)
        memory = self.memory.get(key)
        if indexed is None:
            return None
        patched = memory.patched if memory is not None else None
        if patched is not None and memory is not None:
            same_job = uid_of(patched) == uid_of(indexed)
            if same_job and _resource_version(patched) > _resource_version(indexed):
                return patched
            memory.patched = None
        return indexed

    def memory_of(self, key: Key, uid: str) -> JobMemory:
        memory = self.memory.get(key)
        if memory is None or memory.uid != uid:
            memory = self.memory[key] = JobMemory(uid=uid)  # a new job of the same name
        return memory

    async def observe(self, key: Key, now_s: float) -> tuple[Observation, JobMemory] | None:
        body = self.job_body(key)
        if body is None:
            self.forget(key)
            return None
        if multikueue.dispatched(body):
            return await self._dispatched(key, body)
        manager = manager_of(body)
        if manager is not None:
            # Another controller runs it and writes its status: no read, child or write.
            if key not in self._left:
                self._left.add(key)
                fields = names.log_fields(*key)
                logger.info("job %s/%s: managedBy %s; left to it", *key, manager, extra=fields)
            return None
        memory = self.memory_of(key, uid_of(body))
        # Every observed job, so that the gauge is whole after an operator restart too.
        metrics.PHASES.set(key, (body.get("status") or {}).get("phase"))
        secret = await self._secret(key, memory, body)
        objects = {**self.indexes.children(key), kinds.SECRET.kind: secret}
        unseen = memory.unseen_launcher(objects.get(kinds.LAUNCHER_JOB.kind, ()))
        if unseen is not None:
            jobs = objects.get(kinds.LAUNCHER_JOB.kind, ())
            objects[kinds.LAUNCHER_JOB.kind] = (*jobs, unseen)
        children = sort_children(memory.uid, objects)
        self._settle(memory, children, unseen)
        _remember_launcher_disruptions(memory, children)
        flavors: dict[str, Obj] = {}
        priority: Priority | None = None
        scheduling = (body.get("spec") or {}).get("scheduling") or {}
        served = self.discovery.served if self.discovery is not None else {}
        if served.get("kueue") and scheduling.get("queue"):
            for name in queueing.admitted_flavors(children.workload):
                flavor = await self._flavor(name)
                if flavor is not None:
                    flavors[name] = flavor
            wanted_class = scheduling.get("priorityClassName")
            workload = children.workload
            if wanted_class and (workload is None or workload_finished(workload)):
                priority = await self._priority(str(wanted_class))
        worker_claims = await self._worker_claims(key, body)
        now = now_utc()
        generation = int(body["metadata"].get("generation") or 0)
        ran_on = last_run(memory, children.config_map, generation)
        refusals = [
            r.refusal
            for r in memory.refused.values()
            if not r.refusal.permanent or r.refusal.generation == generation
        ]
        needs_keys = sshkeys.needs_keys(body, children.secret is not None)
        seen = Observation(
            body=body,
            children=children,
            now=now,
            refusals=refusals,
            pod_warnings=self._pod_warnings(key, memory, children),
            accepted_spec=self._accepted_spec(ran_on, generation),
            accepted_raw=ran_on,
            default_image=self.settings.default_image,
            keys=sshkeys.generate_key_pair() if needs_keys else None,
            host_key=sshkeys.generate_key_pair("horovod-job-host") if needs_keys else None,
            stuck_pod_grace=self.settings.stuck_pod_grace,
            restrict_templates=self.settings.restrict_templates,
            reads_logs=self.settings.reads_logs,
            gang_api=served.get("gang", False),
            kueue_api=served.get("kueue", False),
            volcano_api=served.get("volcano", False),
            coscheduling_api=served.get("coscheduling", False),
            discovery_errors=dict(self.discovery.errors) if self.discovery is not None else {},
            flavors=flavors,
            priority=priority,
            worker_claims=worker_claims,
        )
        return seen, memory

    async def _dispatched(self, key: Key, body: Obj) -> tuple[Observation, JobMemory]:
        """MultiKueue's job on the manager cluster: only its Workload is read (and the
        priority class it needs until it has one); it has no other child here."""
        memory = self.memory_of(key, uid_of(body))
        workloads = self.indexes.of(kinds.WORKLOAD).get(key, ())
        children = sort_children(memory.uid, {kinds.WORKLOAD.kind: workloads})
        served = self.discovery.served if self.discovery is not None else {}
        priority: Priority | None = None
        wanted_class = ((body.get("spec") or {}).get("scheduling") or {}).get("priorityClassName")
        if wanted_class and children.workload is None and served.get("kueue"):
            priority = await self._priority(str(wanted_class))
        seen = Observation(
            body=body,
            children=children,
            now=now_utc(),
            default_image=self.settings.default_image,
            kueue_api=served.get("kueue", False),
            priority=priority,
        )
        return seen, memory

    async def _secret(self, key: Key, memory: JobMemory, body: Obj) -> tuple[Obj, ...]:
        """The job's SSH Secret. Secrets are not watched: a watch would need the right
        to list and watch every Secret of the cluster. It is read once per process for
        a job that may still start pods (the first reconcile, after a restart or a
        failover), then known from this operator's own creates and deletes, and read
        again before pods that mount it are created (_secret_gone): a Secret deleted by
        hand matters only to pods not started yet."""
        gloo = (body.get("spec") or {}).get("launchMode") == "gloo"
        phase = (body.get("status") or {}).get("phase")
        if memory.secret_read or gloo or phase in TERMINAL_PHASES:
            pass
        elif not phase:
            # Never reconciled: its status is written before any child exists, so it has
            # no Secret (another's of that name answers the create with a 409). No read:
            # it would add a round trip before every new job's first creates.
            memory.secret, memory.secret_read = None, True
        else:
            await self.read_secret(key, memory)
        return (memory.secret,) if memory.secret is not None else ()

    async def read_secret(self, key: Key, memory: JobMemory) -> Obj | None:
        """Read the job's SSH Secret by name (a slim view), and remember it."""
        found = await self.kube.get("Secret", key[0], names.secret_name(key[1]))
        memory.secret = views.slim_owned(found) if found is not None else None
        memory.secret_read = True
        return memory.secret

    def _accepted_spec(
        self, ran_on: tuple[int, Obj] | None, generation: int
    ) -> HorovodJobSpec | None:
        """The spec the job last ran on, parsed only when an edit has come since: a
        spec of the generation that was accepted is the body's own."""
        if ran_on is None or ran_on[0] == generation:
            return None
        return accepted.parsed(ran_on[1], self.settings.default_image)

    async def _flavor(self, name: str) -> Obj | None:
        """A ResourceFlavor, read at most every FLAVOR_TTL seconds."""
        now = time.monotonic()
        cached = self._flavors.get(name)
        if cached is not None and now - cached[0] < FLAVOR_TTL:
            return cached[1]
        flavor = await self.kube.get("ResourceFlavor", "", name)
        if flavor is None:
            self._flavors.pop(name, None)
            return None
        self._flavors[name] = (now, flavor)
        return flavor

    async def _worker_claims(self, key: Key, body: Obj) -> claims.WorkerClaims | None:
        """The GPUs the worker's DRA claims add up to, for a job that may still create
        pods (None: it names no ResourceClaimTemplate, or creates no pod: finished, or
        Running at a fixed size). Templates are read by name, never listed, at most
        every CLAIM_TEMPLATE_TTL seconds each."""
        spec = body.get("spec") or {}
        phase = (body.get("status") or {}).get("phase")
        if phase in TERMINAL_PHASES or (phase == "Running" and not spec.get("elastic")):
            return None
        template = (spec.get("worker") or {}).get("template")
        refs = claims.template_refs(template if isinstance(template, dict) else None)
        if not refs:
            return None
        found: dict[str, Obj | None] = {}
        for ref in refs:
            try:
                found[ref.template] = await self._claim_template(key[0], ref.template)
            except KubeError as error:
                if not refused(error.status):
                    raise
                return claims.unreadable(ref, key[0], error.status, error.message)
        return claims.count(refs, found, key[0], self.settings.gpu_device_classes)

    async def _claim_template(self, namespace: str, name: str) -> Obj | None:
        now = time.monotonic()
        cached = self._claim_templates.get((namespace, name))
        if cached is not None and now - cached[0] < CLAIM_TEMPLATE_TTL:
            return cached[1]
        found = await self.kube.get("ResourceClaimTemplate", namespace, name)
        if found is None:
            self._claim_templates.pop((namespace, name), None)
            return None
        self._claim_templates[(namespace, name)] = (now, {"spec": found.get("spec") or {}})
        return found

    async def _priority(self, name: str) -> Priority | None:
        """What a priority class name names: a Kueue WorkloadPriorityClass first (the
        class Kueue meant for queueing), else a PriorityClass (pods' priority)."""
        for kind, group in (
            ("WorkloadPriorityClass", "kueue.x-k8s.io"),
            ("PriorityClass", "scheduling.k8s.io"),
        ):
            found = await self.kube.get(kind, "", name)
            if found is not None:
                return Priority(group, kind, name, int(found.get("value") or 0))
        return None

    def _settle(self, memory: JobMemory, children: Children, unseen: Obj | None = None) -> None:
        """Forget expectations the watch has caught up with, or that are too old.
        `unseen`: the launcher Job known from its create only, not from the watch."""
        now = time.monotonic()
        owned = [
            children.secret,
            children.config_map,
            children.service,
            children.launcher_job,
            children.workload,
            *children.workers,
        ]
        seen = {name_of(obj) for obj in owned if obj is not None and obj is not unseen}
        going = {name_of(obj) for obj in owned if obj is not None and terminating(obj)}
        for name in [
            n for n, t in memory.creating.items() if n in seen or now - t > PENDING_WRITE_TTL
        ]:
            del memory.creating[name]
        for name in [
            n
            for n, t in memory.deleting.items()
            if n not in seen or n in going or now - t > PENDING_WRITE_TTL
        ]:
            del memory.deleting[name]
        for name in [n for n in memory.refused if n in seen]:
            del memory.refused[name]

    def _pod_warnings(self, key: Key, memory: JobMemory, children: Children) -> dict[str, Warning]:
        """The newest Warning Event of each pod slow to start (FailedMount, ...), as
        pod_warnings.py last read them; asks for the job's slow pods, no request here.

        Sets memory.warnings_due: when a waiting pod passes SLOW_START_SECONDS (nothing
        else may trigger a reconcile of a pod that only waits); after that the reader
        wakes the job when its pods' warnings change.
        """
        slow: list[str] = []
        dues: list[float] = []
        for pod in [*children.workers, *children.launcher_pods]:
            if not waiting_to_start(pod):
                continue
            waited = _waiting_for(pod)
            if waited < SLOW_START_SECONDS:
                dues.append(SLOW_START_SECONDS - waited)
            else:
                slow.append(name_of(pod))
        memory.warnings_due = max(0.5, min(dues)) if dues else None
        return self.pod_warnings.want(key, slow)


def last_run(memory: JobMemory, config_map: Obj | None, generation: int) -> tuple[int, Obj] | None:
    """(generation, raw spec) the job last ran on: remembered, or after a restart
    read from its ConfigMap (accepted.py), parsed only when an edit came since."""
    if memory.accepted is None and accepted.generation(config_map) not in (None, generation):
        memory.accepted = accepted.recorded(config_map)
    return memory.accepted


# Disrupted launcher pods remembered per job: one per attempt is the most that matters.
MAX_LAUNCHER_DISRUPTIONS: Final = 4


def _remember_launcher_disruptions(memory: JobMemory, children: Children) -> None:
    for pod in children.launcher_pods:
        reason = disruption_of(pod)
        if reason is not None:
            memory.launcher_disruptions[name_of(pod)] = reason
    while len(memory.launcher_disruptions) > MAX_LAUNCHER_DISRUPTIONS:
        del memory.launcher_disruptions[next(iter(memory.launcher_disruptions))]
    children.launcher_disruptions = dict(memory.launcher_disruptions)


def terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _waiting_for(pod: Obj) -> float:
    """Seconds since the pod was scheduled (or created, when bound directly)."""
    since = (pod.get("metadata") or {}).get("creationTimestamp")
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            since = condition.get("lastTransitionTime") or since
    if not since:
        return 0.0
    return (now_utc() - parse_time(since)).total_seconds()
