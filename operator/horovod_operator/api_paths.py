"""Where each kind the operator reads or writes lives in the API (kube.Kube's paths)."""

from __future__ import annotations

from typing import Final

from .api import GROUP, PLURAL, VERSION

# Where each kind lives in the API.
_PATHS: Final[dict[str, str]] = {
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "Secret": "/api/v1/namespaces/{namespace}/secrets",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "Event": "/api/v1/namespaces/{namespace}/events",
    "Job": "/apis/batch/v1/namespaces/{namespace}/jobs",
    "HorovodJob": f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}",
    "Lease": "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
    "PodGroup": "/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups",
    # Kueue (queueing.py); flavors and priority classes are cluster-scoped.
    "Workload": "/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads",
    "ResourceFlavor": "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
    "WorkloadPriorityClass": "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses",
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    # The worker's DRA claims (claims.py), read by name.
    "ResourceClaimTemplate": (
        "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    ),
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}
# Kinds that more than one API group names: the PodGroups of Volcano and of
# scheduler-plugins' coscheduling (podgroups.py), by apiVersion.
_GROUP_PATHS: Final[dict[tuple[str, str], str]] = {
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): (
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups"
    ),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): (
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups"
    ),
}


def collection_path(kind: str, namespace: str, api_version: str = "") -> str:
    """The collection of `kind` (of `api_version` where two groups share the kind)."""
    template = _GROUP_PATHS.get((api_version, kind)) or _PATHS[kind]
    return template.format(namespace=namespace)
