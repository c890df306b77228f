"""Carry out a Plan: post its Events, sweep and delete, patch the ConfigMap, create
the children in dependency order, and delete a finished job whose TTL passed. The
status goes first (status_writing.py); a refused create is remembered with its
backoff and becomes a condition on the next decision (refusals.py classifies)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from . import kinds, metrics, names, views
from .children import controlled_by, describe_owner, role_of
from .conditions import format_time, now_utc
from .kinds import CREATE_STAGES
from .kube import Kube
from .kube_errors import KubeError
from .memory import PROGRESS_INTERVAL, JobMemory, Key, Obj, Refused
from .observing import Observer, terminating
from .plan import Delete, Event, Plan, PodSweep, Refusal, WorkloadAdoption
from .refusals import refused
from .status_writing import StatusWriter

logger = logging.getLogger(__name__)

# A 403 (quota, PodSecurity, a webhook) is retried after 1, 2, 4, ... seconds, at most this.
MAX_REFUSAL_BACKOFF: Final = 60.0
# A Workload status write that conflicted with Kueue's is tried again after this.
WORKLOAD_RETRY: Final = 0.5


class Applier:
    def __init__(self, kube: Kube, observer: Observer, status: StatusWriter) -> None:
        self.kube = kube
        self.observer = observer
        self.status = status
        # False once the server refused a collection delete (RBAC without the
        # deletecollection verb, as granted before it was used): pods go one by one.
        self.sweeps = True

    async def execute(self, key: Key, body: Obj, plan: Plan, memory: JobMemory) -> float | None:
        """Carry out `plan`; the seconds after which to look again, if any.

        The status goes first: a new job's first write is its status, before any
        child exists, and nothing is acted on when that write conflicts.
        """
        observed = body
        if plan.status is not None:
            written = await self.status.write(key, body, plan.status, memory)
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
        if plan.workload_adopt is not None and await self._adopt(key, plan.workload_adopt):
            retry = WORKLOAD_RETRY if retry is None else min(retry, WORKLOAD_RETRY)
        if plan.workload_status is not None and await self.status.write_workload(
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

    async def _adopt(self, key: Key, adoption: WorkloadAdoption) -> bool:
        """Become the controller of MultiKueue's Workload (multikueue.py); True when
        it changed meanwhile (409: the next reconcile reads it again)."""
        meta: dict[str, Any] = {"ownerReferences": [dict(adoption.owner)]}
        if adoption.resource_version:
            meta["resourceVersion"] = adoption.resource_version
        try:
            await self.kube.merge_patch("Workload", key[0], adoption.name, {"metadata": meta})
        except KubeError as error:
            if error.not_found:
                return False
            if error.conflict:
                return True
            raise
        logger.info(
            "job %s/%s: adopted Workload %s (MultiKueue's)",
            *key,
            adoption.name,
            extra=names.log_fields(*key),
        )
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
                        "Pod", key[0], sweep.label_selector, sweep.field_selector, want_names=False
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
        if any(t.kind == kinds.LAUNCHER_JOB.kind for t in targets):
            memory.launcher = None  # no stand-in for a Job being deleted
        for target in targets:
            if target.warning is not None and body is not None:
                await self._post_event(body, Event("Warning", "ForceDeleted", target.warning))

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
        return await self.observer.read_secret(key, memory) is None

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
        for stage_kinds in CREATE_STAGES:
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
        dropped = dropped_fields(obj, created)
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
        if kind == kinds.LAUNCHER_JOB.kind and created:
            memory.launcher = views.slim_launcher_job(created)
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
        going = " and is being deleted" if terminating(current) else ""
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


def dropped_fields(sent: Obj, created: Obj | None) -> list[tuple[str, str, str]]:
    """The gated fields of a PodGroup the server stored without."""
    if sent["kind"] != "PodGroup" or created is None:
        return []
    sent_spec, stored = sent.get("spec") or {}, created.get("spec") or {}
    return [f for f in _GATED_POD_GROUP_FIELDS if sent_spec.get(f[0]) and not stored.get(f[0])]


_NEVER: Final = Refused(Refusal("", "", 0, ""), 0, float("-inf"))
