"""Where an admitted job's pods go: per pod set, the node labels and tolerations of
the flavors Kueue assigned and what its admission checks ask (podSetUpdates), as
builders.Admission (queueing.gate's helper; pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from . import builders, names
from .plan import Obj


def pod_set_admissions(
    workload: Obj, flavors: Mapping[str, Obj]
) -> dict[str, builders.Admission] | None:
    """Per pod set, the node labels and tolerations of the flavors Kueue assigned
    (what Kueue's job framework injects into its jobs' pod templates); None while a
    named flavor has not been read."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get(
        "podSetAssignments"
    ) or ()
    pod_priority_class = priority_kind(workload) != "WorkloadPriorityClass"
    admissions: dict[str, builders.Admission] = {}
    for pod_set in (names.ROLE_WORKER, names.ROLE_LAUNCHER):
        admissions[pod_set] = builders.Admission(pod_priority_class=pod_priority_class)
    for assignment in assignments:
        node_selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
            flavor = flavors.get(flavor_name)
            if flavor is None:
                return None
            spec = flavor.get("spec") or {}
            node_selector.update(spec.get("nodeLabels") or {})
            tolerations += [t for t in spec.get("tolerations") or () if t not in tolerations]
        name = str(assignment.get("name"))
        placed = assignment.get("topologyAssignment")
        admissions[name] = builders.Admission(
            node_selector=node_selector,
            tolerations=tuple(tolerations),
            pod_priority_class=pod_priority_class,
            annotations=_topology_annotation(workload, name) if placed else {},
            domains=tuple(topology_domains(placed)) if placed else (),
            count=int(assignment["count"]) if assignment.get("count") is not None else None,
        )
    for name, admission in list(admissions.items()):
        admissions[name] = _with_pod_set_updates(admission, workload, name)
    return admissions


def _with_pod_set_updates(
    admission: builders.Admission, workload: Obj, pod_set: str
) -> builders.Admission:
    """`admission` with what the Workload's admission checks ask of `pod_set`'s pods
    (status.admissionChecks[].podSetUpdates), as Kueue's job framework applies them
    to its own jobs: labels, annotations and node selector merged (a check's value
    over a flavor's), tolerations added. Only checks that are Ready count: Kueue
    admits after every check is."""
    labels = dict(admission.labels)
    annotations = dict(admission.annotations)
    node_selector = dict(admission.node_selector)
    tolerations = list(admission.tolerations)
    for check in (workload.get("status") or {}).get("admissionChecks") or ():
        if check.get("state") != "Ready":
            continue
        for update in check.get("podSetUpdates") or ():
            if update.get("name") != pod_set:
                continue
            labels.update(update.get("labels") or {})
            annotations.update(update.get("annotations") or {})
            node_selector.update(update.get("nodeSelector") or {})
            tolerations += [t for t in update.get("tolerations") or () if t not in tolerations]
    return dataclasses.replace(
        admission,
        node_selector=node_selector,
        tolerations=tuple(tolerations),
        labels=labels,
        annotations=annotations,
    )


# Kueue counts a bound pod without one of these as usage outside its Topology Aware
# Scheduling, on top of the Workload's own: the pods of a TAS pod set carry the one
# their request says (pkg/util/tas in Kueue v0.17).
_TAS_ANNOTATIONS: Final = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
_TAS_UNCONSTRAINED: Final = "kueue.x-k8s.io/podset-unconstrained-topology"


def _topology_annotation(workload: Obj, pod_set: str) -> dict[str, str]:
    """The TAS annotation of `pod_set`'s pods: its request's level, or unconstrained
    (a pod set Kueue placed without a request: a ClusterQueue of TAS flavors only)."""
    for spec in (workload.get("spec") or {}).get("podSets") or ():
        if spec.get("name") != pod_set:
            continue
        request = spec.get("topologyRequest") or {}
        for mode, annotation in _TAS_ANNOTATIONS.items():
            if request.get(mode):
                return {annotation: str(request[mode])}
    return {_TAS_UNCONSTRAINED: "true"}


def topology_domains(assignment: Mapping[str, Any]) -> list[dict[str, str]]:
    """Kueue's topologyAssignment (v1beta2: levels, and slices of domains with their
    values per level and pod counts), one {level: value} per pod in Kueue's order:
    rank r is the r-th (Kueue's own ungater counts the same way)."""
    levels = [str(level) for level in assignment.get("levels") or ()]
    pods: list[dict[str, str]] = []
    for piece in assignment.get("slices") or ():
        for i in range(int(piece.get("domainCount") or 0)):
            values = [_value(level, i) for level in piece.get("valuesPerLevel") or ()]
            counts = piece.get("podCounts") or {}
            count = counts["universal"] if "universal" in counts else counts["individual"][i]
            pods += [dict(zip(levels, values, strict=True))] * int(count)
    return pods


def _value(level: Mapping[str, Any], i: int) -> str:
    if "universal" in level:
        return str(level["universal"])
    individual = level["individual"]
    return f"{individual.get('prefix', '')}{individual['roots'][i]}{individual.get('suffix', '')}"


def priority_kind(workload: Obj) -> str | None:
    ref = (workload.get("spec") or {}).get("priorityClassRef") or {}
    kind = ref.get("kind")
    return str(kind) if kind else None
