"""Every kind the operator reads or writes, in one table: where it lives in the API and,
for the objects a job owns, their place in its life.

kube.Kube takes its paths from here, watches.py its watched kinds, the applier
(applying.py) the order of its creates, and plan_deletes what goes with a job whose
spec is invalid. A new kind of child is a row here, its builder, its RBAC rule
(charts/, checked by tests/operator/test_permissions.py) and, if it is watched, its
watches.Kind (its index is keyed by the kind's name) and its rule in
children.sort_children.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .api import GROUP, PLURAL, VERSION


@dataclass(frozen=True)
class ApiKind:
    kind: str
    api_version: str  # "v1" is the core group
    plural: str
    namespaced: bool = True
    # A child the job owns: created in this stage (0 first: what the pods mount or
    # wait for, then the pods, then the launcher that connects to them); None: the
    # operator does not create it for a job (or creates it elsewhere, like Events).
    create_stage: int | None = None
    # Deleted with everything else of a job whose spec is invalid (the pods and the
    # launcher are deleted by plan_deletes.delete_pods in any case).
    deleted_when_invalid: bool = False

    def collection(self, namespace: str = "") -> str:
        """The path of its objects: of one namespace, or of every namespace ("")."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        where = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{root}{where}/{self.plural}"


HOROVOD_JOB: Final = ApiKind("HorovodJob", f"{GROUP}/{VERSION}", PLURAL)
# The job's children, in the order they are created.
WORKLOAD: Final = ApiKind("Workload", "kueue.x-k8s.io/v1beta2", "workloads", create_stage=0)
SECRET: Final = ApiKind("Secret", "v1", "secrets", create_stage=0, deleted_when_invalid=True)
CONFIG_MAP: Final = ApiKind(
    "ConfigMap", "v1", "configmaps", create_stage=0, deleted_when_invalid=True
)
SERVICE: Final = ApiKind("Service", "v1", "services", create_stage=0, deleted_when_invalid=True)
# The gang's PodGroup: the native one, Volcano's, scheduler-plugins' (podgroups.py).
POD_GROUP: Final = ApiKind("PodGroup", "scheduling.k8s.io/v1beta1", "podgroups", create_stage=0)
VOLCANO_POD_GROUP: Final = ApiKind(
    "PodGroup", "scheduling.volcano.sh/v1beta1", "podgroups", create_stage=0
)
COSCHEDULING_POD_GROUP: Final = ApiKind(
    "PodGroup", "scheduling.x-k8s.io/v1alpha1", "podgroups", create_stage=0
)
POD: Final = ApiKind("Pod", "v1", "pods", create_stage=1)
LAUNCHER_JOB: Final = ApiKind("Job", "batch/v1", "jobs", create_stage=2)
# Read or written beside the children.
EVENT: Final = ApiKind("Event", "v1", "events")
LEASE: Final = ApiKind("Lease", "coordination.k8s.io/v1", "leases")
RESOURCE_CLAIM_TEMPLATE: Final = ApiKind(
    "ResourceClaimTemplate", "resource.k8s.io/v1", "resourceclaimtemplates"
)
RESOURCE_FLAVOR: Final = ApiKind(
    "ResourceFlavor", "kueue.x-k8s.io/v1beta2", "resourceflavors", namespaced=False
)
WORKLOAD_PRIORITY_CLASS: Final = ApiKind(
    "WorkloadPriorityClass", "kueue.x-k8s.io/v1beta2", "workloadpriorityclasses", namespaced=False
)
PRIORITY_CLASS: Final = ApiKind(
    "PriorityClass", "scheduling.k8s.io/v1", "priorityclasses", namespaced=False
)
CRD: Final = ApiKind(
    "CustomResourceDefinition",
    "apiextensions.k8s.io/v1",
    "customresourcedefinitions",
    namespaced=False,
)

KINDS: Final = (
    HOROVOD_JOB,
    WORKLOAD,
    SECRET,
    CONFIG_MAP,
    SERVICE,
    POD_GROUP,
    VOLCANO_POD_GROUP,
    COSCHEDULING_POD_GROUP,
    POD,
    LAUNCHER_JOB,
    EVENT,
    LEASE,
    RESOURCE_CLAIM_TEMPLATE,
    RESOURCE_FLAVOR,
    WORKLOAD_PRIORITY_CLASS,
    PRIORITY_CLASS,
    CRD,
)
# By kind, the first row of each (a kind two groups name is told by apiVersion).
_BY_KIND: Final = {k.kind: k for k in reversed(KINDS)}
_BY_VERSION: Final = {(k.api_version, k.kind): k for k in KINDS}
# The kinds of each create stage, in order.
CREATE_STAGES: Final = tuple(
    tuple(dict.fromkeys(k.kind for k in KINDS if k.create_stage == stage))
    for stage in sorted({k.create_stage for k in KINDS if k.create_stage is not None})
)
DELETED_WHEN_INVALID: Final = tuple(k.kind for k in KINDS if k.deleted_when_invalid)


def of(kind: str, api_version: str = "") -> ApiKind:
    """The row of `kind` (of `api_version` where two groups name the kind)."""
    return _BY_VERSION.get((api_version, kind)) or _BY_KIND[kind]


def collection_path(kind: str, namespace: str, api_version: str = "") -> str:
    """The path of `kind`'s objects in `namespace`."""
    return of(kind, api_version).collection(namespace)
