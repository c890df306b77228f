"""Observe and act: build the decision's input from the indexes, execute its plan.

What the decision function cannot know lives here, per job: which children
were just created or deleted and are not in the watch yet (so they are not
created twice), what the API server refused (so a refusal becomes a condition
on the next decision, and a 403 is retried with capped backoff), the spec the
job last ran with (for an edit that fails validation later), and the last
status written (a status patch returns a newer body than the watch may have).
All of it can be lost in a restart: the next decision rebuilds it from the
cluster, at the cost of a request or two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from . import accepted, claims, metrics, names, queueing, views
from .api import (
    TERMINAL_PHASES,
    HorovodJobSpec,
    HorovodJobStatus,
    manager_of,
    parse_status,
)
from .children import (
    Children,
    controlled_by,
    describe_owner,
    disruption_of,
    name_of,
    role_of,
    sort_children,
    uid_of,
    waiting_to_start,
    workload_finished,
)
from .conditions import format_time, now_utc, parse_time
from .discovery import Discovery
from .kube import Kube, KubeError
from .memory import PROGRESS_INTERVAL, Indexes, JobMemory, Key, Obj, Refused
from .phases import progress_only, status_body
from .plan import (
    Delete,
    Event,
    Observation,
    Plan,
    PodSweep,
    Priority,
    Refusal,
    WorkloadStatusPatch,
)
from .pod_warnings import PodWarnings, Warning
from .sshkeys import generate_key_pair

logger = logging.getLogger(__name__)


# How long a child we created (or deleted) is trusted to exist (or be going)
# before the watch shows it; after that the index is believed again.
PENDING_WRITE_TTL: Final = 30.0
# A 403 (quota, PodSecurity, a webhook) is retried after 1, 2, 4, ... seconds, at most this.
MAX_REFUSAL_BACKOFF: Final = 60.0
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
# A Workload status write that conflicted with Kueue's is tried again after this.
WORKLOAD_RETRY: Final = 0.5
_KNOWN_STATUS_KEYS: Final = frozenset(
    field.alias or name for name, field in HorovodJobStatus.model_fields.items()
)


def _resource_version(body: Obj | None) -> int:
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


class Executor:
    def __init__(
        self,
        kube: Kube,
        default_image: str | None = None,
        stuck_pod_grace: float = 60.0,
        restrict_templates: bool = False,
    ) -> None:
        self.kube = kube
        self.restrict_templates = restrict_templates
        self.reads_logs = True  # off with --no-first-step-metric (handlers.py)
        # DeviceClasses whose devices count as GPUs (--gpu-device-classes, claims.py).
        self.gpu_device_classes: tuple[str, ...] = claims.DEFAULT_GPU_DEVICE_CLASSES
        self._claim_templates: dict[tuple[str, str], tuple[float, Obj]] = {}
        self._left: set[Key] = set()  # jobs left to another controller, logged once
        self.default_image = default_image
        self.stuck_pod_grace = stuck_pod_grace
        self.indexes = Indexes()
        self.memory: dict[Key, JobMemory] = {}
        # What the cluster serves (handlers.startup; None while its check has not
        # answered): PodGroups for gangs, Kueue's Workloads. Without a Discovery (tests
        # of the executor alone) nothing optional is served.
        self.discovery: Discovery | None = None
        self._flavors: dict[str, tuple[float, Obj]] = {}
        # False once the server refused a collection delete (RBAC without the
        # deletecollection verb, as granted before it was used): pods go one by one.
        self.sweeps = True
        # Slow pods' Warning Events (handlers.startup runs its reader; without one,
        # as in tests of the executor alone, none is known).
        self.pod_warnings = PodWarnings(kube)

    def forget(self, key: Key) -> None:
        self.memory.pop(key, None)
        self._left.discard(key)
        self.pod_warnings.forget(key)
        metrics.PHASES.drop(key)

    # --- observing -----------------------------------------------------------------------

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

    def _memory(self, key: Key, uid: str) -> JobMemory:
        memory = self.memory.get(key)
        if memory is None or memory.uid != uid:
            memory = self.memory[key] = JobMemory(uid=uid)  # a new job of the same name
        return memory

    async def observe(self, key: Key, now_s: float) -> tuple[Observation, JobMemory] | None:
        body = self.job_body(key)
        if body is None:
            self.forget(key)
            return None
        manager = manager_of(body)
        if manager is not None:
            # MultiKueue (or another controller) runs it and writes its status: no
            # read, no child, no write here.
            if key not in self._left:
                self._left.add(key)
                logger.info(
                    "job %s/%s: spec.managedBy is %s; left to it",
                    *key,
                    manager,
                    extra=names.log_fields(*key),
                )
            return None
        memory = self._memory(key, uid_of(body))
        # Every observed job, so that the gauge is whole after an operator restart too.
        metrics.PHASES.set(key, (body.get("status") or {}).get("phase"))
        ix = self.indexes
        children = sort_children(
            memory.uid,
            ix.pods.get(key, ()),
            ix.launchers.get(key, ()),
            await self._secret(key, memory, body),
            ix.config_maps.get(key, ()),
            ix.services.get(key, ()),
            ix.workloads.get(key, ()),
        )
        self._settle(memory, children)
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
        ran_on = self._ran_on(memory, children.config_map, generation)
        refusals = [
            r.refusal
            for r in memory.refused.values()
            if not r.refusal.permanent or r.refusal.generation == generation
        ]
        # Fresh keys for a job without its SSH Secret (launchMode gloo has none). A
        # finished job never gets one again: at start-up with many finished jobs,
        # key generation was most of the reconcile's own CPU.
        needs_keys = (
            children.secret is None
            and (body.get("spec") or {}).get("launchMode") != "gloo"
            and (body.get("status") or {}).get("phase") not in TERMINAL_PHASES
        )
        seen = Observation(
            body=body,
            children=children,
            now=now,
            refusals=refusals,
            pod_warnings=self._pod_warnings(key, memory, children),
            accepted_spec=self._accepted_spec(ran_on, generation),
            accepted_raw=ran_on,
            default_image=self.default_image,
            keys=generate_key_pair() if needs_keys else None,
            host_key=generate_key_pair("horovod-job-host") if needs_keys else None,
            stuck_pod_grace=self.stuck_pod_grace,
            restrict_templates=self.restrict_templates,
            reads_logs=self.reads_logs,
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
            await self._read_secret(key, memory)
        return (memory.secret,) if memory.secret is not None else ()

    async def _read_secret(self, key: Key, memory: JobMemory) -> Obj | None:
        found = await self.kube.get("Secret", key[0], names.secret_name(key[1]))
        memory.secret = views.slim_owned(found) if found is not None else None
        memory.secret_read = True
        return memory.secret

    async def _secret_gone(
        self, key: Key, memory: JobMemory, creates: list[dict[str, Any]]
    ) -> bool:
        """Whether the job's Secret, which this plan's pods mount, was deleted since it
        was read: then nothing is created, and the next reconcile (at once) sees it
        gone (phases: a restart where the attempt's workers hold its key; else a new
        Secret). One GET per reconcile that creates pods, none for gloo."""
        if memory.secret is None or any(o["kind"] == "Secret" for o in creates):
            return False
        sent = [o for o in creates if o["metadata"]["name"] not in memory.creating]
        if not any(o["kind"] in ("Pod", "Job") for o in sent):
            return False
        return await self._read_secret(key, memory) is None

    @staticmethod
    def _ran_on(
        memory: JobMemory, config_map: Obj | None, generation: int
    ) -> tuple[int, Obj] | None:
        """(generation, raw spec) the job last ran on: remembered, or after a restart
        read from its ConfigMap (accepted.py), parsed only when an edit came since."""
        if memory.accepted is None and accepted.generation(config_map) not in (None, generation):
            memory.accepted = accepted.recorded(config_map)
        return memory.accepted

    def _accepted_spec(
        self, ran_on: tuple[int, Obj] | None, generation: int
    ) -> HorovodJobSpec | None:
        """The spec the job last ran on, parsed only when an edit has come since: a
        spec of the generation that was accepted is the body's own."""
        if ran_on is None or ran_on[0] == generation:
            return None
        return accepted.parsed(ran_on[1], self.default_image)

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
        return claims.count(refs, found, key[0], self.gpu_device_classes)

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

    def _settle(self, memory: JobMemory, children: Children) -> None:
        """Forget expectations the watch has caught up with, or that are too old."""
        now = time.monotonic()
        owned = [
            children.secret,
            children.config_map,
            children.service,
            children.launcher_job,
            children.workload,
            *children.workers,
        ]
        seen = {name_of(obj) for obj in owned if obj is not None}
        going = {name_of(obj) for obj in owned if obj is not None and _terminating(obj)}
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

    # --- acting --------------------------------------------------------------------------

    async def execute(self, key: Key, body: Obj, plan: Plan, memory: JobMemory) -> float | None:
        """Carry out `plan`; the seconds after which to look again, if any.

        The status goes first: a new job's first write is its status, before any
        child exists, and nothing is acted on when that write conflicts.
        """
        observed = body
        if plan.status is not None:
            written = await self._write_status(key, body, plan.status, memory)
            if written is None:
                return None
            body = written
        if plan.accepted_spec is not None:
            # Accepted once acted on (a stale view's conflict above never is). The
            # observed body's own spec dict, shared with the watch's copy until an edit
            # replaces that: remembering costs nothing while the spec is unchanged.
            meta = observed.get("metadata") or {}
            memory.accepted = (int(meta.get("generation") or 0), observed.get("spec") or {})
        for event in plan.events:
            await self._post_event(body, event)
        await self._sweep(key, plan.sweeps, memory)
        await self._delete(key, plan.deletes, memory, body)
        if plan.config_data is not None or plan.config_annotations is not None:
            meta = body["metadata"]
            change: dict[str, Any] = {}
            if plan.config_data is not None:
                change["data"] = plan.config_data
            if plan.config_annotations is not None:
                change["metadata"] = {"annotations": plan.config_annotations}
            await self.kube.merge_patch(
                "ConfigMap", meta["namespace"], names.config_name(meta["name"]), change
            )
        retry = await self._create(key, body, plan.creates, memory)
        if plan.workload_status is not None and await self._write_workload_status(
            key[0], plan.workload_status
        ):
            retry = WORKLOAD_RETRY if retry is None else min(retry, WORKLOAD_RETRY)
        if plan.delete_job:
            logger.info(
                "job %s/%s: ttlSecondsAfterFinished passed, deleting it",
                *key,
                extra=names.log_fields(*key),
            )
            await self.kube.delete_job(*key, str(body["metadata"].get("uid") or ""))
        waits = [w for w in (plan.requeue_after, retry) if w is not None]
        if memory.deferred:
            waits.append(max(0.05, memory.last_write + PROGRESS_INTERVAL - time.monotonic()))
        if memory.warnings_due is not None:
            waits.append(memory.warnings_due)
        return min(waits) if waits else None

    async def _write_status(
        self, key: Key, body: Obj, status: HorovodJobStatus, memory: JobMemory
    ) -> Obj | None:
        """Patch the status when it changed; the body to act on, None on a conflict."""
        old = body.get("status") or {}
        new = status_body(status)
        stored = {k: v for k, v in normalized(old).items() if k in _KNOWN_STATUS_KEYS}
        memory.deferred = False
        if new == stored:
            return body
        if progress_only(stored, new) and time.monotonic() - memory.last_write < PROGRESS_INTERVAL:
            memory.deferred = True  # written when the interval has passed, if still true
            return body
        patch: dict[str, Any] = {k: None for k in stored if k not in new}
        patch.update(new)
        meta = body["metadata"]
        try:
            written = await self.kube.patch_job_status(
                meta["namespace"], meta["name"], meta.get("resourceVersion"), patch
            )
        except KubeError as error:
            if error.not_found:
                return None
            if not error.conflict:
                raise
            # Our view was stale: start over from the server's current object.
            memory.patched = await self.kube.get_job(meta["namespace"], meta["name"])
            raise StaleView() from error
        memory.patched = written
        memory.last_write = time.monotonic()
        _count_transition(key, old.get("phase"), status)
        return written

    async def _write_workload_status(self, namespace: str, patch: WorkloadStatusPatch) -> bool:
        """Write the job's Workload status; True when Kueue moved it meanwhile (409)."""
        status: dict[str, Any] = {"conditions": patch.conditions}
        if patch.clear_admission:
            status["admission"] = None
        try:
            await self.kube.patch_status(
                "Workload", namespace, patch.name, patch.resource_version, status
            )
        except KubeError as error:
            if error.not_found:
                return False
            if error.conflict:
                return True
            raise
        logger.info("workload %s/%s: %s", namespace, patch.name, patch.summary)
        return False

    async def _post_event(self, body: Obj, event: Event) -> None:
        logger.info(
            "job %s/%s: %s %s: %s",
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            event.type,
            event.reason,
            event.message,
            extra=names.log_fields(body["metadata"]["namespace"], body["metadata"]["name"]),
        )
        await self.kube.post_event(
            body, event.type, event.reason, event.message, format_time(now_utc())
        )

    async def _sweep(self, key: Key, sweeps: list[PodSweep], memory: JobMemory) -> None:
        """Each sweep's pods in one DELETE by label; one by one where that is refused."""
        for sweep in sweeps:
            todo = [name for name in sweep.names if name not in memory.deleting]
            if not todo:
                continue
            if self.sweeps:
                now = time.monotonic()
                for name in todo:
                    memory.deleting[name] = now
                try:
                    await self.kube.delete_collection(
                        "Pod", key[0], sweep.label_selector, sweep.field_selector
                    )
                    continue
                except KubeError as error:
                    if error.status not in (403, 405):
                        raise
                    self.sweeps = False
                    logger.warning(
                        "pods are deleted one by one: the server refused a collection "
                        "delete (%s); grant the operator the deletecollection verb on pods",
                        error,
                    )
                    for name in todo:
                        memory.deleting.pop(name, None)
            uids = dict(zip(sweep.names, sweep.uids, strict=False))
            await self._delete(
                key, [Delete("Pod", name, uid=uids.get(name, "")) for name in todo], memory
            )

    async def _delete(
        self, key: Key, deletes: list[Delete], memory: JobMemory, body: Obj | None = None
    ) -> None:
        now = time.monotonic()
        targets = [d for d in deletes if d.name not in memory.deleting]
        for target in targets:
            memory.deleting[target.name] = now
        results = await asyncio.gather(
            *(
                self.kube.delete(d.kind, key[0], d.name, d.propagation, d.grace_period, d.uid)
                for d in targets
            ),
            return_exceptions=True,
        )
        errors: list[BaseException] = []
        for target, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                # Not in flight: the retry of this reconcile (with backoff) sends it
                # again, instead of waiting out the pending-write memory (30 s).
                memory.deleting.pop(target.name, None)
                errors.append(result)
        if errors:
            raise errors[0]
        if any(t.kind == "Secret" for t in targets):
            memory.secret = None  # and known: not read again
        for target in targets:
            if target.warning is not None and body is not None:
                await self._post_event(body, Event("Warning", "ForceDeleted", target.warning))

    async def _create(
        self, key: Key, body: Obj, creates: list[dict[str, Any]], memory: JobMemory
    ) -> float | None:
        """Create in dependency order (the pods mount the Secret and ConfigMap); the
        seconds until a refused create may be tried again, if any."""
        generation = int(body["metadata"].get("generation") or 0)
        if await self._secret_gone(key, memory, creates):
            logger.info(
                "job %s/%s: its SSH Secret is gone; looking again before creating pods", *key
            )
            return 0.0
        kinds = (("Workload", "Secret", "ConfigMap", "Service", "PodGroup"), ("Pod",), ("Job",))
        for stage_kinds in kinds:
            stage = [obj for obj in creates if obj["kind"] in stage_kinds]
            now = time.monotonic()
            todo = [
                obj
                for obj in stage
                if obj["metadata"]["name"] not in memory.creating
                and memory.refused.get(obj["metadata"]["name"], _NEVER).retry_at <= now
            ]
            results = await asyncio.gather(
                *(self._create_one(memory, obj, generation) for obj in todo)
            )
            if not all(results) or any(o["metadata"]["name"] in memory.refused for o in stage):
                break  # pods without their Secret would wait; try again after the backoff
        retries = [r.retry_at - time.monotonic() for r in memory.refused.values()]
        return max(0.0, min(retries)) if retries else None

    async def _create_one(self, memory: JobMemory, obj: dict[str, Any], generation: int) -> bool:
        meta = obj["metadata"]
        kind, name = obj["kind"], meta["name"]
        try:
            created = await self.kube.create(obj)
        except KubeError as error:
            if error.conflict:
                return await self._already_exists(memory, obj, generation)
            if refused(error.status):
                self._refuse(memory, obj, error.status, error.message, generation)
                return False
            raise
        dropped = _dropped_fields(obj, created)
        if dropped:
            # Pods would then each make their own claim from the template, or land in
            # any domain: not what the job asked for. A permanent refusal fails it.
            field, gate, remove = dropped[0]
            message = (
                f"the API server dropped spec.{field} from PodGroup {name}: Kubernetes "
                f"1.37's {gate} feature gate is off on kube-apiserver. Fix: enable it on "
                f"kube-apiserver, kube-controller-manager and kube-scheduler, or remove {remove}"
            )
            self._refuse(memory, obj, 422, message, generation)
            return False
        memory.refused.pop(name, None)
        if kind in ("Pod", "Job", "PodGroup", "Workload"):
            # Not in the watch yet (a PodGroup never is: it is not watched); for
            # PENDING_WRITE_TTL it is not created again.
            memory.creating[name] = time.monotonic()
        if kind == "PodGroup":
            await self._retire_earlier_groups(memory, obj)
        if kind == "Secret":
            memory.secret, memory.secret_read = views.slim_owned(created or obj), True
        return True

    async def _already_exists(
        self, memory: JobMemory, obj: dict[str, Any], generation: int
    ) -> bool:
        """409: ours (a create the watch has not shown yet) is fine; anyone else's is
        never adopted or patched, only reported."""
        meta = obj["metadata"]
        current = await self.kube.get(
            obj["kind"], meta["namespace"], meta["name"], str(obj.get("apiVersion") or "")
        )
        if obj["kind"] == "Secret":
            memory.secret = views.slim_owned(current) if current is not None else None
            memory.secret_read = current is not None
        if current is None or controlled_by(current, memory.uid):
            memory.refused.pop(meta["name"], None)
            if obj["kind"] == "PodGroup":
                await self._retire_earlier_groups(memory, obj)
            return True
        going = " and is being deleted" if _terminating(current) else ""
        message = (
            f"{obj['kind']} {meta['name']} already exists{going}; it is controlled by "
            f"{describe_owner(current)}, not by this job. The job waits for it to go"
        )
        self._refuse(memory, obj, 409, message, generation)
        return False

    async def _retire_earlier_groups(self, memory: JobMemory, group: dict[str, Any]) -> None:
        """One PodGroup per job: the attempt's group replaces those of earlier attempts
        (a restart, a resume with another size), in one request, once per group and
        process (after a restart, at the first 409 that finds the group ours). They
        would otherwise pile up until the job goes: eleven after ten restarts."""
        meta = group["metadata"]
        if memory.group == meta["name"]:
            return
        labels = meta["labels"]
        selector = ",".join(
            f"{label}={labels[label]}" for label in (names.LABEL_JOB_NAME, names.LABEL_ROLE)
        )
        try:
            gone = await self.kube.delete_collection(
                "PodGroup",
                meta["namespace"],
                selector,
                f"metadata.name!={meta['name']}",
                api_version=str(group.get("apiVersion") or ""),
            )
        except KubeError as error:
            # Not the job's concern: garbage collection still removes them with it.
            logger.warning(
                "could not delete the PodGroups before %s/%s: %s",
                meta["namespace"],
                meta["name"],
                error,
            )
            return
        memory.group = meta["name"]
        if gone:
            logger.info("deleted earlier PodGroups of %s: %s", meta["name"], ", ".join(gone))

    def _refuse(
        self, memory: JobMemory, obj: dict[str, Any], code: int, message: str, generation: int
    ) -> None:
        name = obj["metadata"]["name"]
        previous = memory.refused.get(name)
        count = previous.count + 1 if previous is not None and previous.refusal.code == code else 1
        backoff = min(MAX_REFUSAL_BACKOFF, 2.0 ** min(count - 1, 16))
        memory.refused[name] = Refused(
            Refusal(obj["kind"], name, code, message, generation, role_of(obj)),
            count,
            time.monotonic() + backoff,
        )
        metrics.API_REFUSALS.labels(kind=obj["kind"], code=str(code)).inc()
        logger.warning("refused: %s %s (%s): %s", obj["kind"], name, code, message)


# Fields of the native PodGroup behind a feature gate: a server with the gate off
# drops them without an error. (field, gate, what the job would remove instead)
_GATED_POD_GROUP_FIELDS: Final = (
    ("resourceClaims", "DRAWorkloadResourceClaims", "spec.scheduling.gang.resourceClaims"),
    (
        "schedulingConstraints",
        "TopologyAwareWorkloadScheduling",
        "spec.scheduling.topology (or make it Preferred)",
    ),
)


def _dropped_fields(sent: Obj, created: Obj | None) -> list[tuple[str, str, str]]:
    """The gated fields of a PodGroup the server stored without."""
    if sent["kind"] != "PodGroup" or created is None:
        return []
    sent_spec, stored = sent.get("spec") or {}, created.get("spec") or {}
    return [f for f in _GATED_POD_GROUP_FIELDS if sent_spec.get(f[0]) and not stored.get(f[0])]


def refused(status: int) -> bool:
    """Whether a create's failure is reported on the job (Stalled, an Event) and tried
    again after a backoff: a refusal (403; 400, 413, 422 are permanent), throttling
    (429) or a server error (5xx: a webhook down with failurePolicy Fail). Those were
    once only retried, and a job said "0/2 ready" for 20 minutes without a cause."""
    return status in (400, 403, 413, 422, 429) or status >= 500


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


class StaleView(Exception):
    """A status write conflicted: reconcile again from the server's object."""


_NEVER: Final = Refused(Refusal("", "", 0, ""), 0, float("-inf"))


def normalized(raw: Obj) -> dict[str, Any]:
    """A stored status in the form status_body gives, to compare them."""
    parsed = parse_status(dict(raw)) if raw else None
    return status_body(parsed) if parsed is not None else {}


def _terminating(obj: Obj) -> bool:
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


def _count_transition(key: Key, before: str | None, status: HorovodJobStatus) -> None:
    after = status.phase
    if before == after or after is None:
        return
    if before is None and status.reason != "InvalidSpec":
        metrics.JOBS_CREATED.inc()
    metrics.PHASES.set(key, after)
    if after == "Succeeded":
        metrics.JOBS_SUCCEEDED.inc()
    elif after == "Failed":
        metrics.JOBS_FAILED.labels(reason=status.reason or "Unknown").inc()
    elif after == "Restarting":
        metrics.JOB_RESTARTS.inc()
    elif after == "Running" and status.attempt_start_time:
        waited = (now_utc() - parse_time(status.attempt_start_time)).total_seconds()
        metrics.TIME_TO_RUNNING.labels(namespace=key[0]).observe(max(0.0, waited))
    if after in ("Succeeded", "Failed") and status.start_time and status.completion_time:
        took = parse_time(status.completion_time) - parse_time(status.start_time)
        metrics.JOB_DURATION.labels(namespace=key[0], phase=after).observe(
            max(0.0, took.total_seconds())
        )
    logger.info(
        "job %s/%s: %s -> %s (%s) %s",
        *key,
        before,
        after,
        status.reason,
        status.message,
        extra=names.log_fields(*key),
    )
