"""Where an admitted Workload's pods go: flavors and admission checks' podSetUpdates."""

from __future__ import annotations

from typing import Any

from horovod_operator import kueue_admission
from horovod_operator.api import parse_job
from horovod_operator.builders import new_launcher_job, new_worker_pod

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
