"""Where an admitted Workload's pods go: flavors and admission checks' podSetUpdates."""

from __future__ import annotations

from typing import Any

import pytest

from horovod_operator import kueue_admission
from horovod_operator.api import parse_job
from horovod_operator.builders import new_launcher_job, new_worker_pod, new_workload
from horovod_operator.views import slim_workload

FLAVOR: dict[str, Any] = {
    "metadata": {"name": "a100"},
    "spec": {
        "nodeLabels": {"pool": "a100"},
        "tolerations": [{"key": "pool", "operator": "Equal", "value": "a100"}],
    },
}
PROVISIONED = {"key": "provisioned", "operator": "Exists", "effect": "NoSchedule"}


def _workload(checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {},
        "status": {
            "admission": {"podSetAssignments": [{"name": "worker", "flavors": {"gpu": "a100"}}]},
            "admissionChecks": checks,
        },
    }


def _check(state: str, **update: Any) -> dict[str, Any]:
    return {"name": "prov", "state": state, "podSetUpdates": [{"name": "worker", **update}]}


def test_a_ready_checks_updates_reach_the_pods_beside_the_flavors() -> None:
    ready = _check(
        "Ready",
        labels={"autoscaling.x-k8s.io/provisioning": "req-1", "horovod.ai/role": "not-this"},
        annotations={"cluster-autoscaler.kubernetes.io/consume-provisioning-request": "req-1"},
        nodeSelector={"node.kubernetes.io/instance-type": "p5"},
        tolerations=[PROVISIONED],
    )
    admissions = kueue_admission.pod_set_admissions(_workload([ready]), {"a100": FLAVOR})
    assert admissions is not None
    worker = admissions["worker"]
    assert worker.node_selector == {"pool": "a100", "node.kubernetes.io/instance-type": "p5"}
    assert PROVISIONED in worker.tolerations and FLAVOR["spec"]["tolerations"][0] in (
        worker.tolerations
    )
    job = parse_job(
        {
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"image": "i", "command": ["c"], "worker": {"replicas": 2}},
        }
    )
    pod = new_worker_pod(job, 0, 0, admission=worker)
    assert pod["metadata"]["labels"]["autoscaling.x-k8s.io/provisioning"] == "req-1"
    # The operator's own labels win: the job's pods are found by them.
    assert pod["metadata"]["labels"]["horovod.ai/role"] == "worker"
    assert pod["metadata"]["annotations"] == {
        "cluster-autoscaler.kubernetes.io/consume-provisioning-request": "req-1"
    }
    assert pod["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5"
    # The launcher's pod set got no update: none of it.
    launcher = new_launcher_job(job, 0, admission=admissions["launcher"])
    assert "annotations" not in launcher["spec"]["template"]["metadata"]


def test_a_check_not_ready_changes_nothing() -> None:
    pending = _check("Pending", nodeSelector={"x": "y"}, labels={"a": "b"})
    admissions = kueue_admission.pod_set_admissions(_workload([pending]), {"a100": FLAVOR})
    assert admissions is not None
    assert admissions["worker"].node_selector == {"pool": "a100"}
    assert admissions["worker"].labels == {}


# --- Kueue's Topology Aware Scheduling ------------------------------------------------------

RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"


def _spread(prefix: str, roots: list[str], counts: list[int]) -> dict[str, Any]:
    """A rack-level assignment as Kueue v0.17 encodes it: `counts[i]` pods in rack
    prefix + roots[i]."""
    values = {"individual": {"prefix": prefix, "roots": roots}}
    piece = {"domainCount": len(roots), "valuesPerLevel": [values]}
    return {"levels": [RACK], "slices": [{**piece, "podCounts": {"individual": counts}}]}


@pytest.mark.parametrize(
    ("assignment", "pods"),
    [
        (  # Kueue v0.17's encoding of 4 hosts in one rack, a pod each (its docs' example)
            {
                "levels": [HOST],
                "slices": [
                    {
                        "domainCount": 4,
                        "valuesPerLevel": [
                            {
                                "individual": {
                                    "prefix": "rack-a-node-",
                                    "roots": ["0", "1", "2", "3"],
                                }
                            }
                        ],
                        "podCounts": {"universal": 1},
                    }
                ],
            },
            [{HOST: f"rack-a-node-{i}"} for i in range(4)],
        ),
        (  # a Preferred spread, 2 + 1, racks a and b
            _spread("rack-", ["a", "b"], [2, 1]),
            [{RACK: "rack-a"}, {RACK: "rack-a"}, {RACK: "rack-b"}],
        ),
        (  # one domain, two levels, and a root that is empty (node-1, node-11)
            {
                "levels": [RACK, HOST],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [
                            {"universal": "r1"},
                            {"individual": {"prefix": "node-1", "roots": ["", "1"], "suffix": ""}},
                        ],
                        "podCounts": {"individual": [1, 2]},
                    },
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "r2"}, {"universal": "node-2"}],
                        "podCounts": {"universal": 1},
                    },
                ],
            },
            [
                {RACK: "r1", HOST: "node-1"},
                {RACK: "r1", HOST: "node-11"},
                {RACK: "r1", HOST: "node-11"},
                {RACK: "r2", HOST: "node-2"},
            ],
        ),
    ],
)
def test_a_topology_assignment_is_one_domain_per_pod_in_kueues_order(
    assignment: dict[str, Any], pods: list[dict[str, str]]
) -> None:
    assert kueue_admission.topology_domains(assignment) == pods


def _tas_job(mode: str = "Required") -> Any:
    return parse_job(
        {
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {
                "image": "i",
                "command": ["c"],
                "worker": {"replicas": 3},
                "scheduling": {"queue": "q", "topology": {"key": RACK, "mode": mode}},
            },
        }
    )


@pytest.mark.parametrize(
    ("mode", "request_key"), [("Required", "required"), ("Preferred", "preferred")]
)
def test_a_queued_job_with_a_topology_asks_kueue_for_it_and_its_pods_follow(
    mode: str, request_key: str
) -> None:
    job = _tas_job(mode)
    workload = new_workload(job, 0, None)
    workers = workload["spec"]["podSets"][0]
    assert workers["topologyRequest"] == {
        request_key: RACK,
        "podIndexLabel": "horovod.ai/worker-index",
    }
    assert "affinity" not in workers["template"]["spec"]  # Kueue places them, not affinity
    assert "topologyRequest" not in workload["spec"]["podSets"][1]  # the launcher: anywhere
    workload["status"] = {
        "admission": {
            "podSetAssignments": [
                {
                    "name": "worker",
                    "flavors": {"nvidia.com/gpu": "a100"},
                    "count": 3,
                    "topologyAssignment": _spread("r", ["1", "2"], [2, 1]),
                },
                {"name": "launcher", "flavors": {}, "count": 1},
            ]
        }
    }
    # Read as the operator keeps it (the watch's slim view), which must keep the request.
    admissions = kueue_admission.pod_set_admissions(slim_workload(workload), {"a100": FLAVOR})
    assert admissions is not None
    placed = [new_worker_pod(job, i, 0, admission=admissions["worker"]) for i in range(3)]
    assert [p["spec"]["nodeSelector"] for p in placed] == [
        {"pool": "a100", RACK: "r1"},
        {"pool": "a100", RACK: "r1"},
        {"pool": "a100", RACK: "r2"},
    ]
    annotation = f"kueue.x-k8s.io/podset-{request_key}-topology"
    assert all(p["metadata"]["annotations"] == {annotation: RACK} for p in placed)
    assert all("affinity" not in p["spec"] for p in placed)
    # The launcher's pod set was not placed by topology: no annotation, no domain.
    launcher = new_launcher_job(job, 0, admission=admissions["launcher"])
    assert "annotations" not in launcher["spec"]["template"]["metadata"]
    assert "nodeSelector" not in launcher["spec"]["template"]["spec"]


def test_a_launcher_kueue_placed_without_a_request_is_unconstrained() -> None:
    """A ClusterQueue of TAS flavors only places every pod set, the launcher's too."""
    job = _tas_job()
    workload = new_workload(job, 0, None)
    one_host = {
        "levels": [HOST],
        "slices": [
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": "n1"}],
                "podCounts": {"universal": 1},
            }
        ],
    }
    workload["status"] = {
        "admission": {
            "podSetAssignments": [
                {"name": "launcher", "flavors": {}, "topologyAssignment": one_host}
            ]
        }
    }
    admissions = kueue_admission.pod_set_admissions(workload, {})
    assert admissions is not None
    template = new_launcher_job(job, 0, admission=admissions["launcher"])["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-unconstrained-topology": "true"
    }
    assert template["spec"]["nodeSelector"] == {HOST: "n1"}
