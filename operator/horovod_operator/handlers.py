"""kopf wiring only: settings and the operator's start and stop.

kopf runs the process (startup, login, cleanup, signals, logging); the
operator's view of the cluster is its own watches (watches.py), and every change
there asks the level-triggered reconciler for a reconcile. There are no kopf
resource handlers on purpose: create/update/delete handlers need a finalizer
and progress annotations (two extra writes per job, and a finalizer that blocks
deletion while the operator is down), and kopf's per-object machinery made
starting with many objects slow. ownerReferences let garbage collection delete
the children, including any created while the job was being deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

import kopf

from . import crd, crd_skew, metrics, watches
from .conditions import format_time, now_utc
from .connection import load_connection
from .discovery import KUEUE, Discovery, Feature
from .kube import FIELD_MANAGER, Kube
from .leader import RENEW_DEADLINE, LeaderElector
from .memory import Key
from .observing import ObserveSettings, Sources
from .pod_warnings import PodWarnings
from .progress import ProgressWatcher
from .reconciler import Reconciler
from .settings import OperatorConfig

logger = logging.getLogger(__name__)

# Set by __main__ before kopf starts; the defaults serve in-process test runners.
CONFIG = OperatorConfig()


def configure(config: OperatorConfig) -> None:
    global CONFIG
    CONFIG = config


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """kopf settings of the operator (separate from startup so that tests can check them)."""
    # The reconciler posts its own Events; kopf posting every log line would
    # double the writes per job.
    settings.posting.enabled = False
    settings.networking.request_timeout = 60
    # kopf serves no resource here (watches.py): its scan of the cluster's APIs would
    # only add a list/watch of every CRD, a right the operator then needs for nothing.
    settings.scanning.disabled = True


async def _check_crd(kube: Kube) -> None:
    """The installed CRD against this operator's own (crd_skew.py): log, metric, Event."""
    try:
        installed = await kube.get("CustomResourceDefinition", "", crd_skew.CRD_NAME)
    except Exception as error:  # never a reason not to start
        logger.warning("cannot read the CRD %s to compare it: %s", crd_skew.CRD_NAME, error)
        return
    if installed is None:
        logger.error("the CRD %s is not installed. Fix: %s", crd_skew.CRD_NAME, crd_skew.FIX)
        return
    missing = crd_skew.outdated(installed, crd.crd())
    metrics.CRD_OUTDATED.set(len(missing))
    if not missing:
        return
    text = crd_skew.message(missing)
    logger.error("%s", text)
    # Events of a cluster-scoped object live in the default namespace.
    subject = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {**installed["metadata"], "namespace": "default"},
    }
    try:
        await kube.post_event(subject, "Warning", "CRDOutdated", text, format_time(now_utc()))
    except Exception as error:
        logger.warning("could not post the CRDOutdated Event: %s", error)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = CONFIG
    configure_settings(settings)
    connection = load_connection(config.kubeconfig)
    identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    user_agent = f"{FIELD_MANAGER} ({identity})"
    memo.elector_kube = None
    elector: LeaderElector | None = None
    if config.leader_elect:
        # Its own client: no token shared with the reconciler's creates, no retries,
        # no request outliving the renew deadline (leader.py).
        elector_kube = memo.elector_kube = Kube(
            connection,
            qps=0,
            connections=2,
            timeout=(RENEW_DEADLINE / 2, RENEW_DEADLINE),
            retries=0,
            user_agent=user_agent,
        )
        elector = LeaderElector(
            elector_kube, config.leader_election_namespace, config.leader_election_id, identity
        )
    kube = Kube(
        connection,
        qps=config.qps,
        burst=config.burst,
        connections=config.api_connections,
        user_agent=user_agent,
        # The fence: the reconciler's writes go out only while the lease is proven.
        may_write=elector.holds if elector is not None else None,
        on_request=metrics.count_request,
    )
    # Native gang scheduling (the Workload API: beta, off by default in 1.37), Volcano's
    # and scheduler-plugins' PodGroups, Kueue's Workloads: detected, never assumed,
    # and failing closed (discovery.py): what did not answer is asked again with
    # backoff, and the jobs that need it wait, Stalled, meanwhile.
    await _check_crd(kube)
    discovery = Discovery(kube)
    await discovery.check_all()
    # Workloads are watched only where Kueue serves them (a restart picks up a later
    # install); known only later, their watch starts then.
    kinds = [*watches.ALWAYS, *([watches.WORKLOADS] if discovery.served["kueue"] else [])]

    # The watches and the slow pods' reader wake the reconciler, which reads what they
    # hold: they are made first and reach it through these.
    def trigger(key: Key) -> None:
        reconciler.trigger(key)

    def hurry(key: Key) -> None:
        reconciler.hurry(key)

    def active() -> bool:
        return reconciler.active

    def synced() -> None:
        # Ready once every watched kind is listed, as controller-runtime's caches: a
        # replica that answers ready has the whole view it decides from.
        reconciler.mark_synced()
        if health is not None:
            health.ready = True

    watched = memo.watches = watches.Watches(
        connection, kinds, config.namespaces, on_change=trigger, on_synced=synced, on_urgent=hurry
    )
    # Why pods are slow to start: a namespace's Warning Events at a time, on the
    # diagnostics budget, beside the reconciles (pod_warnings.py).
    warnings = PodWarnings(kube, on_change=trigger, active=active)
    reconciler = memo.reconciler = Reconciler(
        kube,
        batch_window=config.batch_window,
        settings=ObserveSettings(
            default_image=config.default_image,
            stuck_pod_grace=config.stuck_pod_grace,
            restrict_templates=config.restrict_templates,
            reads_logs=config.first_step_metric,
            gpu_device_classes=config.gpu_device_classes,
        ),
        active=not config.leader_elect,
        synced=False,
        sources=Sources(indexes=watched.indexes(), discovery=discovery, pod_warnings=warnings),
    )
    # How the training goes: rank 0's log, read forward (progress.py): the first step,
    # status.progress, hangs. Off, the operator reads no pod's log (the chart then
    # grants no pods/log).
    memo.first_step = None
    if config.first_step_metric:
        watcher = ProgressWatcher(kube, indexes=lambda: reconciler.executor.indexes, active=active)
        memo.first_step = asyncio.create_task(watcher.run())
    memo.pod_warnings = asyncio.create_task(warnings.run())
    memo.loop_lag = asyncio.create_task(metrics.measure_loop_lag())
    memo.elector = None
    if elector is not None:
        memo.elector = asyncio.create_task(
            elector.run(on_started=reconciler.activate, on_stopped=reconciler.deactivate)
        )
    health: metrics.HealthServer | None = None
    if config.http_port:
        health = metrics.HealthServer(
            config.http_port, stalled=lambda: reconciler.stalled_for() > config.stall_seconds
        )
        await health.start()
    memo.health = health
    watched.start()

    def known(feature: Feature, served: bool) -> None:
        if feature is KUEUE and served:
            watched.add(watches.WORKLOADS)  # its store shows in the indexes at once
        reconciler.trigger_all()  # the jobs that waited for it

    memo.discovery = asyncio.create_task(discovery.retry(known)) if discovery.pending() else None
    logger.info(
        "horovod-operator watching %s",
        ", ".join(config.namespaces) if config.namespaces else "all namespaces",
    )


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf logs in before it runs anything; with the reconciler's credentials
    (--kubeconfig or in-cluster), although kopf itself watches nothing (watches.py)."""
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
    for name in ("elector", "first_step", "discovery", "loop_lag", "pod_warnings"):
        task: asyncio.Task[None] | None = getattr(memo, name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    watched: watches.Watches | None = getattr(memo, "watches", None)
    if watched is not None:
        await watched.close()
    reconciler: Reconciler | None = getattr(memo, "reconciler", None)
    if reconciler is not None:
        await reconciler.shutdown()
        await reconciler.kube.close()
    elector_kube: Kube | None = getattr(memo, "elector_kube", None)
    if elector_kube is not None:
        await elector_kube.close()
    health: metrics.HealthServer | None = getattr(memo, "health", None)
    if health is not None:
        await health.stop()
