"""kopf wiring only: settings, indexes, and handlers that ask for reconciles.

The HorovodJob has no kopf create/update/delete handlers on purpose: those
need a finalizer and progress annotations (two extra writes per job, and a
finalizer that blocks deletion while the operator is down). The reconciler is
level-triggered instead, and ownerReferences let garbage collection delete
the children, including any created while the job was being deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any, Final

import kopf

from . import metrics, names, podgroups
from .api import GROUP, PLURAL, VERSION
from .connection import load_connection
from .first_step import FirstStepWatcher
from .kube import Kube, KubeError
from .leader import LeaderElector
from .reconciler import Reconciler
from .settings import OperatorConfig

logger = logging.getLogger(__name__)

# Set by __main__ before kopf starts; the defaults serve in-process test runners.
CONFIG = OperatorConfig()

_MANAGED: dict[str, Any] = {
    names.LABEL_MANAGED_BY: names.MANAGED_BY,
    names.LABEL_JOB_NAME: kopf.PRESENT,
}


def configure(config: OperatorConfig) -> None:
    global CONFIG
    CONFIG = config


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """kopf settings of the operator (separate from startup so that tests can check them)."""
    # Server-side label selectors: the operator never receives, indexes or keeps
    # pods and Jobs that are not its own, however big the cluster.
    settings.watching.label_selectors["v1", "pods"] = names.MANAGED_SELECTOR
    settings.watching.label_selectors["batch", "v1", "jobs"] = names.MANAGED_SELECTOR
    for plural in ("secrets", "configmaps", "services"):
        settings.watching.label_selectors["v1", plural] = names.MANAGED_SELECTOR
    settings.watching.label_selectors["kueue.x-k8s.io", "v1beta2", "workloads"] = (
        names.MANAGED_SELECTOR
    )
    # Explicit persistence, although the handlers here store nothing: event
    # handlers and indexes need neither progress nor finalizers.
    settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # The reconciler posts its own Events; kopf posting every log line would
    # double the writes per job.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60


async def _served(kube: Kube, group_version: str, plural: str, feature: str) -> bool:
    """Whether the API server serves `plural` (discovery), logged; not when unsure."""
    try:
        served = await kube.serves(group_version, plural)
    except KubeError as error:
        logger.warning(
            "%s: cannot tell whether %s %s are served (%s); assuming not",
            feature,
            group_version,
            plural,
            error,
        )
        return False
    logger.info(
        "%s (%s %s): %s", feature, group_version, plural, "served" if served else "not served"
    )
    return served


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = CONFIG
    configure_settings(settings)
    kube = Kube(
        load_connection(config.kubeconfig),
        qps=config.qps,
        burst=config.burst,
        threads=config.api_threads,
    )
    kube.on_request = metrics.count_request
    reconciler = memo.reconciler = Reconciler(
        kube,
        batch_window=config.batch_window,
        default_image=config.default_image,
        stuck_pod_grace=config.stuck_pod_grace,
        active=not config.leader_elect,
        restrict_templates=config.restrict_templates,
    )
    # Native gang scheduling needs the Workload API (beta, off by default in 1.37):
    # detected, never assumed. A cluster that enables it later needs a restart.
    reconciler.executor.gang_api = await _served(
        kube, "scheduling.k8s.io/v1beta1", "podgroups", "native gang scheduling"
    )
    # Volcano's and scheduler-plugins' PodGroups (gang.policy Volcano, Coscheduling):
    # detected the same way; a job that asks for one the cluster lacks waits, Stalled.
    volcano, coscheduling = podgroups.VOLCANO, podgroups.COSCHEDULING
    reconciler.executor.volcano_api = await _served(
        kube, volcano.api_version, volcano.plural, "Volcano gangs"
    )
    reconciler.executor.coscheduling_api = await _served(
        kube, coscheduling.api_version, coscheduling.plural, "coscheduling gangs"
    )
    # Kueue admits jobs with a queue as one Workload when its API is served
    # (queueing.py); without it the queue is only a label on the pods.
    reconciler.executor.kueue_api = await _served(
        kube, "kueue.x-k8s.io/v1beta2", "workloads", "Kueue admission"
    )
    # Time to the first training step: rank 0's line in its log (first_step.py).
    watcher = FirstStepWatcher(
        kube, indexes=lambda: reconciler.executor.indexes, active=lambda: reconciler.active
    )
    memo.first_step = asyncio.create_task(watcher.run())
    memo.elector = None
    if config.leader_elect:
        identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        elector = LeaderElector(
            kube, config.leader_election_namespace, config.leader_election_id, identity
        )
        memo.elector = asyncio.create_task(
            elector.run(on_started=reconciler.activate, on_stopped=reconciler.deactivate)
        )
    memo.health = None
    if config.http_port:
        health = metrics.HealthServer(
            config.http_port, stalled=lambda: reconciler.stalled_for() > config.stall_seconds
        )
        await health.start()
        health.ready = True
        memo.health = health
    logger.info(
        "horovod-operator watching %s",
        ", ".join(config.namespaces) if config.namespaces else "all namespaces",
    )


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use the same credentials as the reconciler (--kubeconfig or in-cluster);
    kopf logs in again when the API server answers 401, which rereads a rotated token."""
    connection = load_connection(CONFIG.kubeconfig)
    header = connection.authorization()
    scheme, token = None, None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=connection.server,
        ca_path=connection.ca_file,
        insecure=connection.insecure,
        scheme=scheme,
        token=token,
        certificate_path=connection.cert_file,
        private_key_path=connection.key_file,
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for name in ("elector", "first_step"):
        task: asyncio.Task[None] | None = getattr(memo, name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    reconciler: Reconciler | None = getattr(memo, "reconciler", None)
    if reconciler is not None:
        await reconciler.shutdown()
        reconciler.kube.close()
    health: metrics.HealthServer | None = getattr(memo, "health", None)
    if health is not None:
        await health.stop()


# --- indexes: the reconciler's view of the cluster -----------------------------------------


@kopf.index(GROUP, VERSION, PLURAL)
def hvjob_bodies(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", name): dict(body)}


@kopf.index("v1", "pods", labels=_MANAGED)
def hvjob_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): slim_pod(body)}


@kopf.index("batch", "v1", "jobs", labels=_MANAGED)
def hvjob_launchers(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): dict(body)}


# What the decisions read of a pod (children.py); a real pod's body is ~10-35 KB,
# mostly spec and managedFields, which the index would otherwise keep per pod.
_POD_META: Final = (
    "name",
    "uid",
    "labels",
    "ownerReferences",
    "deletionTimestamp",
    "creationTimestamp",
)
_POD_STATUS: Final = (
    "phase",
    "reason",
    "conditions",
    "containerStatuses",
    "initContainerStatuses",
)


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    slim_spec: dict[str, Any] = {
        "containers": [{"name": c.get("name")} for c in spec.get("containers") or ()]
    }
    if spec.get("nodeName"):
        slim_spec["nodeName"] = spec["nodeName"]
    return {
        "kind": "Pod",
        "metadata": {key: meta[key] for key in _POD_META if key in meta},
        "spec": slim_spec,
        "status": {key: status[key] for key in _POD_STATUS if key in status},
    }


# The Secret, ConfigMap and Service are watched only to know that they exist and
# whose they are: the index keeps their metadata (and the ConfigMap's hostfile),
# never a private key.
def _slim(body: kopf.Body, keep_data: bool = False) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    slim: dict[str, Any] = {
        "kind": body.get("kind"),
        "metadata": {
            key: meta[key]
            for key in ("name", "uid", "labels", "ownerReferences", "deletionTimestamp")
            if key in meta
        },
    }
    if keep_data:
        slim["data"] = dict(body.get("data") or {})
    return slim


@kopf.index("v1", "secrets", labels=_MANAGED)
def hvjob_secrets(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): _slim(body)}


@kopf.index("v1", "configmaps", labels=_MANAGED)
def hvjob_config_maps(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): _slim(body, keep_data=True)}


@kopf.index("v1", "services", labels=_MANAGED)
def hvjob_services(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): _slim(body)}


# A Workload as the decisions read it (queueing.py): its pod sets' templates, the
# bulk of it, are the operator's own and never read back.
def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    slim_spec = {
        key: spec[key]
        for key in ("queueName", "priorityClassRef", "priority", "active")
        if key in spec
    }
    slim_spec["podSets"] = [
        {"name": p.get("name"), "count": p.get("count")} for p in spec.get("podSets") or ()
    ]
    return {
        "kind": "Workload",
        "metadata": {
            key: meta[key]
            for key in (
                "name",
                "uid",
                "labels",
                "ownerReferences",
                "deletionTimestamp",
                "resourceVersion",
                "generation",
            )
            if key in meta
        },
        "spec": slim_spec,
        "status": dict(body.get("status") or {}),
    }


# Kueue's Workloads: on a cluster without Kueue kopf logs once that it cannot
# serve them ("Unresolved resources"), and watches them if the CRD appears.
@kopf.index("kueue.x-k8s.io", "v1beta2", "workloads", labels=_MANAGED)
def hvjob_workloads(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace or "", labels[names.LABEL_JOB_NAME]): slim_workload(body)}


# --- events: each asks for a reconcile of the job it belongs to ----------------------------


def _trigger(memo: kopf.Memo, key: tuple[str, str], indexes: dict[str, Any]) -> None:
    reconciler: Reconciler = memo.reconciler
    reconciler.bind(indexes)
    reconciler.trigger(key)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    _trigger(memo, (namespace or "", name), kwargs)


@kopf.on.event("v1", "pods", labels=_MANAGED)
async def pod_event(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    _trigger(memo, (namespace or "", labels[names.LABEL_JOB_NAME]), kwargs)


@kopf.on.event("batch", "v1", "jobs", labels=_MANAGED)
async def launcher_event(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    _trigger(memo, (namespace or "", labels[names.LABEL_JOB_NAME]), kwargs)


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels=_MANAGED)
@kopf.on.event("v1", "secrets", labels=_MANAGED)
@kopf.on.event("v1", "configmaps", labels=_MANAGED)
@kopf.on.event("v1", "services", labels=_MANAGED)
async def object_event(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    _trigger(memo, (namespace or "", labels[names.LABEL_JOB_NAME]), kwargs)
