"""The HorovodJob models: defaults, and one clear message per invalid field."""

from typing import Any

import pytest
from pydantic import ValidationError

from horovod_operator.api import MANAGED_BY, format_validation_error, manager_of, parse_job


def body(name: str = "mnist", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {"image": "horovod-worker:0.1.0", "command": ["python", "train.py"], **spec},
    }


def test_gloo_is_a_launch_mode() -> None:
    assert parse_job(body(launchMode="gloo")).spec.launch_mode == "gloo"


def test_defaults() -> None:
    job = parse_job(body())
    spec = job.spec
    assert spec.slots_per_worker == 1
    assert spec.launch_mode == "mpi"
    assert spec.worker.replicas == 1
    assert spec.worker.resources is None
    assert spec.run_policy.backoff_limit == 3
    assert spec.run_policy.clean_pod_policy == "Running"
    assert spec.run_policy.launcher_creation_policy == "WaitForWorkersReady"
    assert spec.run_policy.suspend is False
    assert spec.run_policy.active_deadline_seconds is None
    assert spec.scheduling.queue is None
    assert spec.total_slots() == 1


def test_camel_case_round_trip() -> None:
    job = parse_job(
        body(
            slotsPerWorker=4,
            worker={"replicas": 3, "resources": {"limits": {"nvidia.com/gpu": 4}}},
            runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 60, "cleanPodPolicy": "All"},
            scheduling={"priorityClassName": "high", "queue": "gpus"},
        )
    )
    assert job.spec.total_slots() == 12
    dumped = job.spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["runPolicy"]["activeDeadlineSeconds"] == 60
    assert dumped["scheduling"] == {
        "priorityClassName": "high",
        "queue": "gpus",
        "gang": {"policy": "Auto"},
    }
    # What the aliases write reads back as the same spec.
    assert parse_job({**body(), "spec": dumped}).spec == job.spec


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("a", {"worker": {"replicas": 0}}, "spec.worker.replicas: Input should be greater"),
        ("a", {"worker": {"replicas": -1}}, "spec.worker.replicas: Input should be greater"),
        ("a", {"slotsPerWorker": 0}, "spec.slotsPerWorker: Input should be greater"),
        ("a", {"launchMode": "nccl"}, "spec.launchMode: Input should be 'mpi' or 'gloo'"),
        ("a", {"bogus": 1}, "spec.bogus: Extra inputs are not permitted"),
        ("a", {"worker": {"replica": 2}}, "spec.worker.replica: Extra inputs are not permitted"),
        ("a", {"command": []}, "spec.command: List should have at least 1 item"),
        ("a", {"image": ""}, "spec.image: no image: set spec.image, or start the operator"),
        ("a", {"worker": {"replicas": "two"}}, "spec.worker.replicas: Input should be a valid"),
        (
            "a",
            {"slotsPerWorker": 2, "worker": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
            "spec.slotsPerWorker: 2 is more than the 1 GPU(s) requested per worker",
        ),
        (
            "a",
            {"worker": {"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}},
            "spec.worker.resources.limits: nvidia.com/gpu must be a whole number",
        ),
        ("a", {"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit: Input should"),
        (
            "a",
            {"runPolicy": {"cleanPodPolicy": "Some"}},
            "spec.runPolicy.cleanPodPolicy: Input should be 'None', 'Running' or 'All'",
        ),
        (
            "a",
            {"launcher": {"horovodrunArgs": ["-np", "4"]}},
            "spec.launcher.horovodrunArgs: '-np' is written by the operator",
        ),
        (
            "a",
            {"launcher": {"horovodrunArgs": ["--hostfile=/h"]}},
            "spec.launcher.horovodrunArgs: '--hostfile' is written by the operator",
        ),
        (
            "a",
            {"launchMode": "gloo", "launcher": {"horovodrunArgs": ["--verbose"]}},
            "launcher.horovodrunArgs: launchMode gloo runs no horovodrun and no ssh",
        ),
        (
            "a",
            {"launchMode": "gloo", "ssh": {"authMountPath": "/root/.ssh"}},
            "ssh.authMountPath: launchMode gloo runs no horovodrun and no ssh",
        ),
        (
            "a",
            {"launcher": {"horovodrunArgs": ["--mpi-args=-x A --mca pml ucx"]}},
            "--mpi-args sets MCA parameter 'pml', which horovodrun already writes",
        ),
        ("a", {"ssh": {"port": 22}}, "ssh.port: only an image's own sshd"),
        ("a", {"ssh": {"authMountPath": "root/.ssh"}}, "spec.ssh.authMountPath: String should"),
        ("x" * 54, {"worker": {"replicas": 11}}, "metadata.name: 'xxxx"),
        ("x" * 55, {}, "use at most 54 characters"),
        ("1job", {}, "metadata.name: '1job' must be a DNS-1035 label"),
    ],
)
def test_invalid_specs_name_the_field(name: str, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_job(body(name, **spec))
    assert message in format_validation_error(raised.value)


@pytest.mark.parametrize(
    ("name", "replicas"),
    [
        ("x" * 54, 10),  # x...x-worker-9 is exactly 63 characters
        ("x" * 53, 100),  # x...x-worker-99
        ("a", 1),
    ],
)
def test_longest_valid_names(name: str, replicas: int) -> None:
    assert parse_job(body(name, worker={"replicas": replicas})).metadata.name == name


def test_slots_may_equal_gpus_and_gpus_may_be_strings() -> None:
    job = parse_job(
        body(slotsPerWorker=8, worker={"resources": {"limits": {"nvidia.com/gpu": "8"}}})
    )
    assert job.spec.worker.resources is not None
    assert job.spec.worker.resources.gpus() == 8


def test_slots_unbounded_without_gpus() -> None:
    assert parse_job(body(slotsPerWorker=16)).spec.total_slots() == 16


def test_metadata_and_status_extras_are_ignored() -> None:
    raw = body()
    raw["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    raw["status"] = {"phase": "Running", "restarts": 2}
    job = parse_job(raw)
    assert job.status is not None
    assert job.status.restarts == 2


def test_an_empty_image_takes_the_operators_default() -> None:
    job_body = body("a", image="")
    assert parse_job(job_body, default_image="registry.local/worker:2").spec.image == (
        "registry.local/worker:2"
    )
    job_body["spec"]["image"] = "mine:1"
    assert parse_job(job_body, default_image="registry.local/worker:2").spec.image == "mine:1"


def test_min_available_above_the_replicas_names_the_field() -> None:
    gang: dict[str, Any] = {"minAvailable": 3}
    raw = {
        "apiVersion": "horovod.ai/v1alpha1",
        "kind": "HorovodJob",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {
            "image": "img",
            "command": ["train"],
            "worker": {"replicas": 2},
            "scheduling": {"gang": gang},
        },
    }
    with pytest.raises(ValidationError, match=r"scheduling.gang.minAvailable: 3 .*replicas \(2\)"):
        parse_job(raw)
    gang["minAvailable"] = 1
    assert parse_job(raw).spec.gang_size() == 1
    del gang["minAvailable"]
    assert parse_job(raw).spec.gang_size() == 2


def test_a_job_is_left_to_the_controller_its_managed_by_names() -> None:
    def job(value: object) -> dict[str, object]:
        return {"spec": {"managedBy": value}} if value is not None else {"spec": {}}

    assert manager_of(job(None)) is None
    assert manager_of(job(MANAGED_BY)) is None
    assert manager_of(job("kueue.x-k8s.io/multikueue")) == "kueue.x-k8s.io/multikueue"
    assert manager_of({}) is None and manager_of({"spec": None}) is None
