"""Where an admitted job's pods go: per pod set, the node labels and tolerations of
the flavors Kueue assigned and what its admission checks ask (podSetUpdates), as
builders.Admission (queueing.gate's helper; pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
        admissions[str(assignment.get("name"))] = builders.Admission(
            node_selector=node_selector,
            tolerations=tuple(tolerations),
            pod_priority_class=pod_priority_class,
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
    return builders.Admission(
        node_selector=node_selector,
        tolerations=tuple(tolerations),
        pod_priority_class=admission.pod_priority_class,
        labels=labels,
        annotations=annotations,
    )


def priority_kind(workload: Obj) -> str | None:
    ref = (workload.get("spec") or {}).get("priorityClassRef") or {}
    kind = ref.get("kind")
    return str(kind) if kind else None
