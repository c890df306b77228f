"""The API rights the operator uses, by RBAC resource, and where it uses them.

The chart's Role/ClusterRole (charts/horovod-operator/templates/_helpers.tpl and
rbac/cluster-reader.yaml) grant exactly these: tests/operator/integration/test_chart.py
compares `kubectl auth can-i --list` as the chart's ServiceAccount with them, and
tests/operator/test_permissions.py ties the list/watch rights to what watches.py
watches. A right added to the code is added here, in the chart and in the docs
(docs/security.md)."""

from __future__ import annotations

from typing import Final

Rights = dict[str, frozenset[str]]

# In each watched namespace (a ClusterRole when all namespaces are watched).
NAMESPACED: Final[Rights] = {
    # watches.JOBS; status_writing.StatusWriter.write rereads after a conflict; the TTL deletes.
    "horovodjobs.horovod.ai": frozenset({"get", "list", "watch", "delete"}),
    "horovodjobs.horovod.ai/status": frozenset({"patch"}),
    # Children set blockOwnerDeletion (OwnerReferencesPermissionEnforcement).
    "horovodjobs.horovod.ai/finalizers": frozenset({"update"}),
    # watches.PODS; get: a 409 is checked to be ours; deletecollection: sweeps.
    "pods": frozenset({"get", "list", "watch", "create", "delete", "deletecollection"}),
    "services": frozenset({"get", "list", "watch", "create", "delete"}),
    # Read by name (observing.Observer._secret), never listed or watched.
    "secrets": frozenset({"get", "create", "delete"}),
    # patch: the hostfile and the accepted spec (accepted.py).
    "configmaps": frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    "jobs.batch": frozenset({"get", "list", "watch", "create", "delete"}),
    # create: the job's Events; list: the Warnings of pods slow to start.
    "events": frozenset({"create", "list"}),
    # One group per job: created before its workers, the earlier ones deleted.
    "podgroups.scheduling.k8s.io": frozenset({"get", "create", "deletecollection"}),
    "podgroups.scheduling.volcano.sh": frozenset({"get", "create", "deletecollection"}),
    "podgroups.scheduling.x-k8s.io": frozenset({"get", "create", "deletecollection"}),
    # watches.WORKLOADS (where Kueue is served); its status as Kueue's job framework;
    # patch: MultiKueue's Workload on a worker cluster adopted (multikueue.py).
    "workloads.kueue.x-k8s.io": frozenset({"get", "list", "watch", "create", "patch"}),
    "workloads.kueue.x-k8s.io/status": frozenset({"patch"}),
    # observing.Observer._claim_template: the GPUs a worker's DRA claims add up to (claims.py).
    "resourceclaimtemplates.resource.k8s.io": frozenset({"get"}),
}

# Only with the time-to-first-step metric (--first-step-metric, the chart's
# metrics.firstStep.enabled): progress.py reads rank 0's log (first step, progress, hangs).
FIRST_STEP: Final[Rights] = {"pods/log": frozenset({"get"})}

# Cluster-scoped reads, by name only (a ClusterRole in both modes).
CLUSTER: Final[Rights] = {
    # handlers._check_crd, restricted to the one name (resourceNames).
    "customresourcedefinitions.apiextensions.k8s.io": frozenset({"get"}),
    # observing.Observer._flavor and _priority.
    "resourceflavors.kueue.x-k8s.io": frozenset({"get"}),
    "workloadpriorityclasses.kueue.x-k8s.io": frozenset({"get"}),
    "priorityclasses.scheduling.k8s.io": frozenset({"get"}),
}

# In the release namespace, with leader election: leader.py.
LEADER_ELECTION: Final[Rights] = {
    "leases.coordination.k8s.io": frozenset({"get", "create", "update"})
}


def namespaced(first_step: bool = True) -> Rights:
    """What a watched namespace grants, the first-step metric on or off."""
    return {**NAMESPACED, **(FIRST_STEP if first_step else {})}
