"""The creates of a plan: what the attempt lacks, in the order the cluster needs it
(decide.py's helper; pure). Never an object whose name another holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import accepted, builders, names, queueing, stalled
from .api import HorovodJob, HorovodJobStatus
from .children import name_of
from .phases import active_replicas, workers_ready_to_start
from .plan import Observation, Plan


def _with_replicas(job: HorovodJob, replicas: int) -> HorovodJob:
    if replicas == job.spec.worker_count() or job.spec.elastic:
        return job
    worker = job.spec.worker.model_copy(update={"replicas": replicas})
    spec = job.spec.model_copy(update={"worker": worker})
    return job.model_copy(update={"spec": spec})


def ensure_children(
    plan: Plan,
    job: HorovodJob,
    status: HorovodJobStatus,
    seen: Observation,
    queue: queueing.Gate | None = None,
    ran_on: tuple[int, Mapping[str, Any]] | None = None,
) -> None:
    """Create what the attempt lacks; never an object whose name another holds.
    A job that Kueue admits gets its pods only where the admission puts them.
    `ran_on`: (generation, raw spec) of the spec it runs on, kept in the ConfigMap."""
    if stalled.undiscovered(job, seen):
        return  # fail closed: nothing until the cluster says what it serves
    children = seen.children
    job = _with_replicas(job, active_replicas(job.model_copy(update={"status": status})))
    attempt = status.restarts

    def want(obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] not in children.foreign:
            plan.creates.append(obj)

    ssh = job.spec.launch_mode == "mpi"
    if ssh and children.secret is None and seen.keys is not None and seen.host_key is not None:
        want(builders.new_ssh_secret(job, seen.keys, seen.host_key))
    # Built only when it may be written: its hostfile names every worker, and building
    # it in every pass of a 512-worker job was 3 % of the operator's CPU (2026-12-07).
    if children.config_map is None:
        config_map = builders.new_config_map(job)
        if ran_on is not None:
            config_map["metadata"]["annotations"] = accepted.record(*ran_on)
        want(config_map)
    else:
        data = builders.new_config_map(job)["data"] if not children.workers else None
        if data is not None and children.config_map.get("data") != data:
            # A resume or restart with another shape: the new attempt gets its hostfile
            # before its pods (a running attempt keeps the one it started with).
            plan.config_data = data
        if ran_on is not None and accepted.generation(children.config_map) != ran_on[0]:
            plan.config_annotations = accepted.record(*ran_on)
    if children.service is None:
        want(builders.new_worker_service(job))

    existing = {name_of(pod) for pod in children.workers}
    missing = [
        i
        for i in range(job.spec.worker_count())
        if names.worker_name(job.metadata.name, i) not in existing
    ]
    gang = gang_scheduled(job, seen)
    required = job.spec.scheduling.gang.policy not in ("Auto", "None")
    if (required or job.spec.scheduling.gang.needs_native()) and not gang:
        return  # no worker without its required gang; stalled.problems says why
    admissions: dict[str, builders.Admission | None] = {}
    if queue is not None:
        if queue.admissions is None:
            return  # admitted, but a flavor is not read yet
        admissions = dict(queue.admissions)
    if missing and stalled.claims_problem(job, seen) is not None:
        return  # stalled.problems names the claim and the fix
    if missing and gang:
        # Before its pods: the scheduler holds them until their group is complete.
        want(builders.new_pod_group(job, attempt, admissions.get(names.ROLE_WORKER)))
    for index in missing:
        want(builders.new_worker_pod(job, index, attempt, gang, admissions.get(names.ROLE_WORKER)))
    # The launcher waits for the watch to show every worker; an elastic one only for
    # those it starts with (a pod quota may refuse the others for a long time).
    if (missing and job.spec.elastic is None) or children.stray_launcher_pods:
        return
    if children.launcher_job is not None:
        return
    policy = job.spec.run_policy.launcher_creation_policy
    if policy == "AtStartup" or workers_ready_to_start(job, status):
        want(builders.new_launcher_job(job, attempt, admissions.get(names.ROLE_LAUNCHER)))


def gang_scheduled(job: HorovodJob, seen: Observation) -> bool:
    """Whether the workers are placed as one gang (a PodGroup the cluster serves):
    native (Auto, Native), Volcano's or scheduler-plugins' coscheduling."""
    policy = job.spec.scheduling.gang.policy
    if policy == "Volcano":
        return seen.volcano_api is True
    if policy == "Coscheduling":
        return seen.coscheduling_api is True
    return policy != "None" and seen.gang_api is True
