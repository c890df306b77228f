"""Gangs for schedulers other than kube-scheduler: Volcano's and scheduler-plugins'
coscheduling PodGroups (spec.scheduling.gang.policy Volcano | Coscheduling).

Pure, like builders.py: a validated HorovodJob in, a plain dict out. Each
attempt gets one PodGroup `<job>-gang-<attempt>-<size>` (the native gang's
name), owned by the job and created before its worker pods; the workers name
it (Volcano: the annotation scheduling.k8s.io/group-name; coscheduling: the
label scheduling.x-k8s.io/pod-group) and are placed by that scheduler
(spec.schedulerName, unless spec.scheduling.schedulerName says otherwise).

The group holds only the workers: the launcher is created once every worker is
Ready (launcherCreationPolicy WaitForWorkersReady), so a launcher in the group
would leave it one member short until after the workers ran, and the
scheduler would hold them forever. minMember is the gang size (the workers, or
gang.minAvailable) and minResources what those workers request together, GPUs
included, so that the scheduler admits the group only where all of it fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from . import names
from .api import HorovodJob

Obj = dict[str, Any]


@dataclass(frozen=True)
class GangScheduler:
    """One non-native gang: its PodGroup API, default scheduler and how pods join."""

    policy: str  # the spec.scheduling.gang.policy value
    api_version: str
    plural: str
    scheduler_name: str  # the pods' schedulerName unless spec.scheduling.schedulerName is set
    install: str  # what the cluster needs, for the Stalled message (docs/scheduling.md)


VOLCANO: Final = GangScheduler(
    policy="Volcano",
    api_version="scheduling.volcano.sh/v1beta1",
    plural="podgroups",
    scheduler_name="volcano",
    install="install Volcano (its CRDs, vc-scheduler and vc-controller-manager: "
    "https://volcano.sh/en/docs/installation/), then restart the operator "
    "(docs/scheduling.md#volcano)",
)
COSCHEDULING: Final = GangScheduler(
    policy="Coscheduling",
    api_version="scheduling.x-k8s.io/v1alpha1",
    plural="podgroups",
    # The second scheduler's name in scheduler-plugins' own Helm chart.
    scheduler_name="scheduler-plugins-scheduler",
    install="install scheduler-plugins (its PodGroup CRD and a scheduler with the "
    "Coscheduling plugin: https://github.com/kubernetes-sigs/scheduler-plugins), then "
    "restart the operator (docs/scheduling.md#scheduler-plugins-coscheduling)",
)
BY_POLICY: Final = {gang.policy: gang for gang in (VOLCANO, COSCHEDULING)}

# How a pod names its group: Volcano reads an annotation, coscheduling a label.
VOLCANO_GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"


def of(job: HorovodJob) -> GangScheduler | None:
    """The job's non-native gang scheduler, if its policy names one."""
    return BY_POLICY.get(job.spec.scheduling.gang.policy)


def group_name(job: HorovodJob, attempt: int) -> str:
    return names.pod_group_name(job.metadata.name, attempt, job.spec.gang_size())


def new_pod_group(job: HorovodJob, metadata: Obj, worker: Obj) -> Obj:
    """The attempt's PodGroup for the job's gang scheduler (`metadata` is the
    native group's: name, namespace, labels, owner; `worker` one of its pods)."""
    gang = of(job)
    if gang is None:
        raise ValueError(f"gang policy {job.spec.scheduling.gang.policy} has no PodGroup here")
    spec: Obj = {"minMember": job.spec.gang_size()}
    resources = gang_resources(job, worker)
    if resources:
        spec["minResources"] = resources
    if gang is VOLCANO:
        if job.spec.scheduling.queue:
            spec["queue"] = job.spec.scheduling.queue
        if job.spec.scheduling.priority_class_name:
            spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    else:
        # How long members wait at the scheduler's Permit for the rest of the group.
        timeout = job.spec.run_policy.startup_timeout_seconds
        if timeout is not None:
            spec["scheduleTimeoutSeconds"] = timeout
    return {"apiVersion": gang.api_version, "kind": "PodGroup", "metadata": metadata, "spec": spec}


def join(job: HorovodJob, attempt: int, metadata: Obj, pod_spec: Obj) -> None:
    """Make a worker pod a member of the attempt's group, placed by its scheduler."""
    gang = of(job)
    if gang is None:
        return
    group = group_name(job, attempt)
    if gang is VOLCANO:
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            VOLCANO_GROUP_ANNOTATION: group,
        }
    else:
        metadata["labels"] = {**metadata["labels"], COSCHEDULING_GROUP_LABEL: group}
    pod_spec["schedulerName"] = job.spec.scheduling.scheduler_name or gang.scheduler_name


def gang_resources(job: HorovodJob, worker: Obj) -> dict[str, str]:
    """What the gang's workers request together (minResources): a worker pod's
    effective requests times the gang size."""
    per_pod = pod_requests(worker["spec"])
    size = job.spec.gang_size()
    return {name: format_quantity(value * size) for name, value in sorted(per_pod.items())}


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """A pod's effective requests, as the scheduler counts them: the containers'
    (and restartable init containers') sum, or the largest init container's where
    that is more; a container's request defaults to its limit."""
    total = _sum(
        _requests(c)
        for c in [
            *(pod_spec.get("containers") or []),
            *(c for c in pod_spec.get("initContainers") or [] if _sidecar(c)),
        ]
    )
    for init in pod_spec.get("initContainers") or []:
        if not _sidecar(init):
            for name, value in _requests(init).items():
                total[name] = max(total.get(name, Decimal(0)), value)
    for name, value in (pod_spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + _quantity(value)
    return total


def _sidecar(container: Obj) -> bool:
    return container.get("restartPolicy") == "Always"


def _requests(container: Obj) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: _quantity(value) for name, value in merged.items()}


def _sum(parts: Iterable[dict[str, Decimal]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for part in parts:
        for name, value in part.items():
            total[name] = total.get(name, Decimal(0)) + value
    return total


def format_quantity(value: Decimal) -> str:
    """A quantity the API server accepts: whole units, else milli-units (rounded up)."""
    if value == value.to_integral_value():
        return str(int(value))
    milli = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
    return f"{int(milli)}m"


# Kubernetes quantity suffixes (resource.Quantity): binary, then decimal SI.
_SUFFIXES: Final = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def _quantity(value: object) -> Decimal:
    """A quantity ("500m", "4Gi", "1e3", 2) as a number; the API server has already
    validated the pod's, so anything else is a ValueError naming the value."""
    text = str(value).strip()
    # A trailing "E" is exa ("1E"); "1E3" is an exponent, which Decimal reads.
    number, scale = text, Decimal(1)
    for suffix, factor in _SUFFIXES.items():
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    try:
        return Decimal(number) * scale
    except ArithmeticError:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None
