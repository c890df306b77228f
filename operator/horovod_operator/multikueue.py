"""MultiKueue: a HorovodJob that Kueue dispatches to another cluster.

MultiKueue (Kueue v0.17, its generic adapter for kinds it does not build in)
runs a job whose spec.managedBy is kueue.x-k8s.io/multikueue in two places:

- **The manager cluster**, where the user applies the job. Kueue dispatches the
  job's *Workload*, and for an external kind the job's own controller creates it
  (Kueue's KEP 2349). So this operator creates that Workload, once, and nothing
  else: no pod, no child, no job status (MultiKueue mirrors the worker copy's
  status onto the job) and no Workload status (MultiKueue finishes it).
- **A worker cluster**, where MultiKueue creates a copy of the Workload (the same
  name, no owner) and, once Kueue admitted it there, a copy of the job without
  spec.managedBy and labelled with the Workload's name. The copy is an ordinary
  job for the operator there, which uses that Workload: it adopts it (sets itself
  as its controller, as Kueue's job framework does for its own kinds) and never
  creates one of its own (queueing.gate).

docs/kueue.md says how to set it up; docs/dev/multikueue.md is the reading of
Kueue's source this follows.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import ValidationError

from . import builders, names
from .api import (
    TERMINAL_PHASES,
    HorovodJob,
    format_validation_error,
    manager_of,
    parse_job,
    parse_status,
)
from .children import Children, controller_of, describe_owner
from .conditions import REASON_CHILD_CONFLICT, REASON_INVALID_SPEC, REASON_QUEUED_BY_KUEUE
from .plan import Event, Observation, Plan, WorkloadAdoption

# The spec.managedBy MultiKueue's adapters require of the manager's copy.
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
# The label MultiKueue puts on the worker's copy: the name of its Workload there.
PREBUILT_WORKLOAD_LABEL: Final = "kueue.x-k8s.io/prebuilt-workload-name"
# The Event's reason when a job MultiKueue should run gets no Workload here.
REASON_NOT_DISPATCHED: Final = "NotDispatched"
# Where a priority class the job names is not there yet, look again after this.
RETRY_SECONDS: Final = 5.0


def dispatched(body: Any) -> bool:
    """Whether MultiKueue runs this stored job elsewhere (the manager's copy)."""
    return manager_of(body) == MULTIKUEUE


def prebuilt_workload(labels: dict[str, str] | None) -> str | None:
    """The Workload MultiKueue made for the worker's copy of a job, by name."""
    return (labels or {}).get(PREBUILT_WORKLOAD_LABEL) or None


def plan_dispatch(seen: Observation) -> Plan:
    """The manager's copy: its Workload, created once (while the job has none and
    has not finished), for MultiKueue to dispatch. A job without a queue, or on a
    cluster without Kueue, gets nothing: Kueue has no Workload to dispatch then."""
    body = seen.body
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return Plan()
    scheduling = (body.get("spec") or {}).get("scheduling") or {}
    if seen.kueue_api is None:
        return Plan()  # discovery has not answered yet; it reconciles every job when it does
    if not scheduling.get("queue") or seen.kueue_api is False:
        # MultiKueue dispatches a Workload, and only a queued job on a cluster that
        # serves Kueue has one: say so, as nobody else will (nobody writes its status).
        if not scheduling.get("queue"):
            why = "spec.scheduling.queue is unset. Fix: name a LocalQueue whose ClusterQueue"
            why += " has the MultiKueue admission check"
        else:
            why = "this cluster serves no Kueue Workload API (kueue.x-k8s.io/v1beta2)"
        message = f"not dispatched by MultiKueue: {why}"
        return Plan(events=[Event("Warning", REASON_NOT_DISPATCHED, message)])
    if seen.children.workload is not None:
        return Plan()  # created already: MultiKueue owns what happens to it
    previous = parse_status(body.get("status"))
    if previous is not None and previous.phase in TERMINAL_PHASES:
        return Plan()  # finished where it ran; a deleted Workload is not made again
    try:
        job = parse_job(body, seen.default_image)
    except ValidationError as error:
        # Nothing to dispatch; MultiKueue writes the status, so an Event says why.
        message = (
            f"not dispatched by MultiKueue: no Workload is created for an invalid spec: "
            f"{format_validation_error(error)}"
        )
        return Plan(events=[Event("Warning", REASON_INVALID_SPEC, message)])
    if job.spec.scheduling.priority_class_name and seen.priority is None:
        return Plan(requeue_after=RETRY_SECONDS)
    name = names.workload_name(job.metadata.name, 0)
    if name in seen.children.foreign:
        message = f"Workload {name} already exists and is not this job's; not dispatched"
        return Plan(events=[Event("Warning", REASON_CHILD_CONFLICT, message)])
    return Plan(creates=[builders.new_workload(job, 0, seen.priority)])


def wait_or_adopt(
    job: HorovodJob, children: Children, name: str
) -> tuple[tuple[str, str], WorkloadAdoption | None]:
    """The worker's copy: why it waits for MultiKueue's Workload `name`, and its
    adoption once it is there with no controller (MultiKueue creates it with none).
    The adoption is conditional on the version read: a concurrent change is a 409,
    and the next reconcile reads it again."""
    found = children.foreign.get(name)
    if found is None:
        why = f"Workload {name} ({PREBUILT_WORKLOAD_LABEL}) is not there; the job waits"
        return (REASON_QUEUED_BY_KUEUE, f"{why} for MultiKueue to create it"), None
    if controller_of(found) is not None:
        owner = describe_owner(found)
        why = f"Workload {name} ({PREBUILT_WORKLOAD_LABEL}) is controlled by {owner}"
        return (REASON_CHILD_CONFLICT, f"{why}, not this job; the job waits"), None
    meta = found.get("metadata") or {}
    adoption = WorkloadAdoption(
        name=name,
        resource_version=str(meta.get("resourceVersion") or ""),
        owner=builders.owner_reference(job),
    )
    why = f"Workload {name}, made by MultiKueue, becomes this job's"
    return (REASON_QUEUED_BY_KUEUE, f"{why}; waiting for Kueue to admit it"), adoption
