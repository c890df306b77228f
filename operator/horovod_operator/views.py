"""What the operator keeps of each object it watches (pure; watches.py does the watching).

A real pod's body is ~10-35 KB, mostly spec and managedFields, which the
operator never reads back; the job's Secret (read by name, not watched) is kept
without its private key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from . import accepted

Obj = dict[str, Any]

# What the decisions read of a pod (children.py, pod_state.py).
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
_OWNED_META: Final = ("name", "uid", "labels", "ownerReferences", "deletionTimestamp")


def whole(body: Mapping[str, Any]) -> Obj:
    """HorovodJobs are kept whole (the decisions read their specs) but for
    managedFields, which nothing reads and which can be half the body."""
    meta = body.get("metadata") or {}
    if "managedFields" not in meta:
        return dict(body)
    return {
        **body,
        "metadata": {key: value for key, value in meta.items() if key != "managedFields"},
    }


def slim_pod(body: Mapping[str, Any]) -> Obj:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    slim_spec: Obj = {"containers": [{"name": c.get("name")} for c in spec.get("containers") or ()]}
    if spec.get("nodeName"):
        slim_spec["nodeName"] = spec["nodeName"]
    return {
        "kind": "Pod",
        "metadata": {key: meta[key] for key in _POD_META if key in meta},
        "spec": slim_spec,
        "status": {key: status[key] for key in _POD_STATUS if key in status},
    }


def slim_owned(body: Mapping[str, Any], keep_data: bool = False) -> Obj:
    """The ConfigMap and Service are watched, and the Secret read, only to know that
    they exist and whose they are: their metadata (and the ConfigMap's hostfile),
    never a private key."""
    meta = body.get("metadata") or {}
    slim: Obj = {
        "kind": body.get("kind"),
        "metadata": {key: meta[key] for key in _OWNED_META if key in meta},
    }
    if keep_data:
        slim["data"] = dict(body.get("data") or {})
    return slim


def slim_launcher_job(body: Mapping[str, Any]) -> Obj:
    """A launcher's batch Job as the decisions read it (children.py): whose it is, its
    role and attempt (labels), whether it is going, and its status (the conditions
    say Complete or Failed). Never its pod template, the bulk of it: the whole Job
    was 20 containers for the garbage collector to walk, this is 5 (ceiling.md)."""
    meta = body.get("metadata") or {}
    return {
        "kind": body.get("kind"),
        "metadata": {key: meta[key] for key in _OWNED_META if key in meta},
        "status": dict(body.get("status") or {}),
    }


def slim_config_map(body: Mapping[str, Any]) -> Obj:
    """And the spec the job last accepted (accepted.py), kept in its annotations."""
    slim = slim_owned(body, keep_data=True)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    kept = {key: annotations[key] for key in accepted.ANNOTATIONS if key in annotations}
    if kept:
        slim["metadata"]["annotations"] = kept
    return slim


def slim_workload(body: Mapping[str, Any]) -> Obj:
    """A Workload as the decisions read it (queueing.py): its pod sets' templates, the
    bulk of it, are the operator's own and never read back."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    slim_spec = {
        key: spec[key]
        for key in ("queueName", "priorityClassRef", "priority", "active")
        if key in spec
    }
    # A pod set's topologyRequest says which TAS annotation its pods carry.
    slim_spec["podSets"] = [
        {key: p[key] for key in ("name", "count", "topologyRequest") if key in p}
        for p in spec.get("podSets") or ()
    ]
    kept = (*_OWNED_META, "resourceVersion", "generation")
    return {
        "kind": "Workload",
        "metadata": {key: meta[key] for key in kept if key in meta},
        "spec": slim_spec,
        "status": dict(body.get("status") or {}),
    }
