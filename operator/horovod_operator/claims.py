"""GPUs asked for through Dynamic Resource Allocation: the worker template's
ResourceClaimTemplates, counted.

A worker can ask for GPUs with the device plugin's `nvidia.com/gpu` or with
ResourceClaims (resource.k8s.io/v1), or both. The operator needs the count per
worker wherever it uses the device plugin's: the slots check (each rank its own
GPU) and the ranks' HVJOB_GPUS_PER_WORKER. Claims are counted from the
ResourceClaimTemplates the worker pod names (one claim per pod, so one set of
devices per worker); the executor reads them by name, this module counts.

Only devices of a GPU DeviceClass count (`--gpu-device-classes`: NVIDIA's
gpu.nvidia.com and mig.nvidia.com, AMD's gpu.amd.com, Intel's gpu.intel.com by
default): a NIC or a ComputeDomain channel in the same claim is not a rank's
GPU. A count that cannot be known before allocation (allocationMode All, or
alternatives of different sizes) is a named problem, never a silent zero.

Pure: raw objects in, counts and (reason, message) problems out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .conditions import (
    REASON_CLAIM_NOT_COUNTABLE,
    REASON_CLAIM_TEMPLATE_NOT_FOUND,
    REASON_CLAIM_TEMPLATE_UNREADABLE,
    REASON_TOO_FEW_GPUS,
)

API_VERSION: Final = "resource.k8s.io/v1"
DEFAULT_GPU_DEVICE_CLASSES: Final = (
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "gpu.amd.com",
    "gpu.intel.com",
)
_FIELD: Final = "spec.worker.template.spec.resourceClaims"


@dataclass(frozen=True)
class TemplateRef:
    """A pod-level claim made from a ResourceClaimTemplate: one claim per pod."""

    index: int  # in the template's spec.resourceClaims
    claim: str  # the pod's name for it
    template: str  # the ResourceClaimTemplate's name


@dataclass(frozen=True)
class WorkerClaims:
    """What the worker's claims add up to: GPUs per worker, or why that is unknown."""

    gpus: int = 0
    problem: tuple[str, str] | None = None
    # Device classes the claims ask for that do not count as GPUs, when none does:
    # worth a Warning (a GPU class the operator does not know?), not a stop (a CPU
    # job may claim a NIC).
    uncounted: tuple[str, ...] = ()


def template_refs(worker_template: Mapping[str, Any] | None) -> list[TemplateRef]:
    """The ResourceClaimTemplates a worker pod template names (resourceClaimName
    claims are one object every pod would share, not devices per worker)."""
    spec = (worker_template or {}).get("spec") or {}
    refs = []
    for i, claim in enumerate(spec.get("resourceClaims") or ()):
        if isinstance(claim, Mapping) and claim.get("resourceClaimTemplateName"):
            refs.append(
                TemplateRef(i, str(claim.get("name")), str(claim["resourceClaimTemplateName"]))
            )
    return refs


def count(
    refs: list[TemplateRef],
    found: Mapping[str, Mapping[str, Any] | None],
    namespace: str,
    gpu_classes: Collection[str] = DEFAULT_GPU_DEVICE_CLASSES,
) -> WorkerClaims:
    """GPUs per worker from the templates `refs` name (`found`: name -> the template
    read, None when it does not exist)."""
    total = 0
    others: set[str] = set()
    for ref in refs:
        where = f"{_FIELD}[{ref.index}] ({ref.claim})"
        template = found.get(ref.template)
        if template is None:
            return WorkerClaims(
                problem=(
                    REASON_CLAIM_TEMPLATE_NOT_FOUND,
                    f"{where} names ResourceClaimTemplate {ref.template}, which does not "
                    f"exist in namespace {namespace}; no worker is created until it does. "
                    f"Fix: create it (kubectl get resourceclaimtemplates -n {namespace})",
                )
            )
        gpus, problem = _gpus_in(template, gpu_classes, others)
        if problem is not None:
            return WorkerClaims(
                problem=(
                    REASON_CLAIM_NOT_COUNTABLE,
                    f"{where}: ResourceClaimTemplate {ref.template} {problem}; the operator "
                    "needs the GPUs per worker before it starts the ranks (one per GPU). Fix: "
                    "ask for an exact count (allocationMode ExactCount, the default, with "
                    "count)",
                )
            )
        total += gpus
    return WorkerClaims(gpus=total, uncounted=() if total else tuple(sorted(others)))


def unreadable(ref: TemplateRef, namespace: str, code: int, words: str) -> WorkerClaims:
    """A template the API server would not give (403: RBAC from a chart older than
    DRA support; 429, 5xx): named, and asked for again, never a silent retry loop."""
    return WorkerClaims(
        problem=(
            REASON_CLAIM_TEMPLATE_UNREADABLE,
            f"{_FIELD}[{ref.index}] ({ref.claim}): the API server refused to read "
            f"ResourceClaimTemplate {ref.template} in namespace {namespace} ({code}): {words}; "
            "no worker is created until it can be counted. Fix for a 403: grant the operator "
            "get on resourceclaimtemplates.resource.k8s.io (the chart does)",
        )
    )


def _gpus_in(
    template: Mapping[str, Any], gpu_classes: Collection[str], others: set[str]
) -> tuple[int, str | None]:
    devices = ((template.get("spec") or {}).get("spec") or {}).get("devices") or {}
    total = 0
    for request in devices.get("requests") or ():
        name = request.get("name")
        exactly = request.get("exactly")
        if exactly is not None:
            gpus, problem = _gpus_of(exactly, gpu_classes, others)
            if problem is not None:
                return 0, f"request {name} {problem}"
            total += gpus
            continue
        # firstAvailable: the scheduler picks one alternative; all must give as many.
        counts = set()
        for sub in request.get("firstAvailable") or ():
            gpus, problem = _gpus_of(sub, gpu_classes, others)
            if problem is not None:
                return 0, f"request {name}, alternative {sub.get('name')}, {problem}"
            counts.add(gpus)
        if len(counts) > 1:
            return 0, (
                f"request {name} has firstAvailable alternatives of {sorted(counts)} GPUs, "
                "so the ranks per worker depend on which one the scheduler picks"
            )
        total += counts.pop() if counts else 0
    return total, None


def _gpus_of(
    request: Mapping[str, Any], gpu_classes: Collection[str], others: set[str]
) -> tuple[int, str | None]:
    device_class = request.get("deviceClassName")
    if device_class not in gpu_classes:
        others.add(str(device_class))
        return 0, None
    if request.get("allocationMode", "ExactCount") == "All":
        return 0, (
            f"asks for all devices of class {request.get('deviceClassName')} "
            "(allocationMode All), a count known only once allocated"
        )
    return int(request.get("count") or 1), None


def blocking(slots: int, plugin_gpus: int | None, claims: WorkerClaims) -> tuple[str, str] | None:
    """Why no worker may be created for these claims: a template's problem, or fewer
    GPUs per worker (the device plugin's and the claims' together) than ranks."""
    if claims.problem is not None:
        return claims.problem
    gpus = (plugin_gpus or 0) + claims.gpus
    if claims.gpus and slots > gpus:
        plugin = f" and {plugin_gpus} from worker.resources" if plugin_gpus else ""
        return (
            REASON_TOO_FEW_GPUS,
            f"slotsPerWorker: {slots} is more than the {gpus} GPU(s) per worker "
            f"({claims.gpus} from the worker's ResourceClaimTemplates{plugin}); each rank "
            "needs its own GPU. Fix: lower slotsPerWorker, or ask for more devices",
        )
    return None
