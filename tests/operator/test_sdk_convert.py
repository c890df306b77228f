"""`hvjob convert`: kubeflow MPIJobs as HorovodJobs the operator accepts, with a
warning for each thing that does not carry over."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from horovod_operator.api import parse_job
from horovod_operator.sdk.cli import main as hvjob
from horovod_operator.sdk.convert import ConvertError, convert

# The shape of mpi-operator's v2beta1 Horovod examples (written for this test).
MPIJOB: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "resnet", "labels": {"team": "vision"}},
    "spec": {
        "slotsPerWorker": 2,
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "runPolicy": {
            "cleanPodPolicy": "Running",
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": 600,
            "schedulingPolicy": {"queue": "gpu-queue", "minAvailable": 3},
        },
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "launcher",
                                "image": "example.org/resnet:1",
                                "command": ["mpirun"],
                                "args": [
                                    "-np", "4", "--allow-run-as-root", "-bind-to", "none",
                                    "-x", "NCCL_DEBUG=INFO", "-mca", "pml", "ob1",
                                    "python", "train.py", "--model", "resnet50",
                                ],
                            }
                        ]
                    }
                },
            },
            "Worker": {
                "replicas": 2,
                "template": {
                    "spec": {
                        "nodeSelector": {"gpu": "a100"},
                        "containers": [
                            {
                                "name": "worker",
                                "image": "example.org/resnet:1",
                                "resources": {"limits": {"nvidia.com/gpu": 2}},
                            }
                        ],
                    }
                },
            },
        },
    },
}  # fmt: skip


def test_the_program_resources_template_and_policies_carry_over() -> None:
    job, warnings = convert(MPIJOB)
    parsed = parse_job(job)
    assert parsed.metadata.name == "resnet" and parsed.metadata.labels == {"team": "vision"}
    assert parsed.spec.image == "example.org/resnet:1"
    assert parsed.spec.command == ["python", "train.py", "--model", "resnet50"]
    assert parsed.spec.total_slots() == 4
    assert parsed.spec.worker.resources is not None
    assert parsed.spec.worker.resources.gpus() == 2
    assert job["spec"]["worker"]["template"]["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert parsed.spec.run_policy.backoff_limit == 1
    assert parsed.spec.run_policy.ttl_seconds_after_finished == 600
    assert parsed.spec.scheduling.queue == "gpu-queue"
    assert parsed.spec.scheduling.gang.min_available == 2, "the launcher is not in our gang"
    # mpirun's own options reach mpirun through horovodrun, after the generated -np;
    # placement through --binding-args (horovodrun writes its own otherwise).
    assert parsed.spec.launcher.horovodrun_args == [
        "--binding-args=-bind-to none",
        "--mpi-args=-x NCCL_DEBUG=INFO",
    ]
    # The image runs its own sshd with the keys where it expects them.
    assert parsed.spec.ssh.auth_mount_path == "/home/mpiuser/.ssh"
    text = "\n".join(warnings)
    assert "image's own sshd" in text
    # What the operator provides itself is not worth a warning.
    assert "-np" not in text and "--allow-run-as-root" not in text
    # -mca pml ob1 is horovodrun's own already (Open MPI refuses it twice).
    assert "pml" not in text


def test_an_mca_parameter_horovodrun_writes_otherwise_is_pointed_out() -> None:
    mpijob = yaml.safe_load(yaml.safe_dump(MPIJOB))
    container = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    container["args"] = [
        "-mca",
        "btl",
        "tcp,self",
        "-mca",
        "btl_vader_single_copy_mechanism",
        "none",
        "python",
        "t.py",
    ]
    job, warnings = convert(mpijob)
    assert job["spec"]["launcher"]["horovodrunArgs"] == [
        "--mpi-args=-mca btl_vader_single_copy_mechanism none"
    ]
    assert any("'-mca btl tcp,self' is dropped" in w for w in warnings), warnings


def test_horovodrun_options_pass_as_they_are_and_elastic_ones_are_pointed_out() -> None:
    mpijob = yaml.safe_load(yaml.safe_dump(MPIJOB))
    container = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    container["command"] = ["horovodrun"]
    container["args"] = [
        "-np", "4", "--min-np", "2", "--network-interfaces", "eth0", "--verbose",
        "--mpi-args=-x A", "python", "t.py",
    ]  # fmt: skip
    job, warnings = convert(mpijob)
    assert job["spec"]["launcher"]["horovodrunArgs"] == [
        "--network-interfaces", "eth0", "--verbose", "--mpi-args=-x A",
    ]  # fmt: skip
    assert any("'--min-np 2' is dropped" in w for w in warnings), warnings


def test_the_workers_sshd_and_the_launchers_env_carry_over() -> None:
    """A v2beta1 worker runs the image's sshd; an old example's [""] means its entrypoint."""
    mpijob = yaml.safe_load(yaml.safe_dump(MPIJOB))
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    replicas["Worker"]["template"]["spec"]["containers"][0]["command"] = ["/usr/sbin/sshd", "-De"]
    replicas["Launcher"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    del mpijob["spec"]["sshAuthMountPath"]
    job, _ = convert(mpijob)
    worker = job["spec"]["worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    assert job["spec"]["ssh"] == {"authMountPath": "/root/.ssh"}, "mpi-operator's default"
    launcher = job["spec"]["launcher"]["template"]["spec"]["containers"]
    assert launcher == [{"name": "launcher", "env": [{"name": "A", "value": "1"}]}]
    replicas["Worker"]["template"]["spec"]["containers"][0]["command"] = [""]
    job, _ = convert(mpijob)
    assert "command" not in job["spec"]["worker"]["template"]["spec"]["containers"][0]


def test_a_rank_count_that_disagrees_with_the_workers_is_pointed_out() -> None:
    mpijob = yaml.safe_load(yaml.safe_dump(MPIJOB))
    args = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    args["args"][1] = "8"
    _, warnings = convert(mpijob)
    assert any("-np 8 is not workers x slotsPerWorker (2 x 2)" in w for w in warnings)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "TFJob"}, "not MPIJob"),
        ({"spec": {"mpiReplicaSpecs": {"Launcher": {}}}}, "Worker is missing"),
    ],
)
def test_what_cannot_be_converted_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConvertError, match=message):
        convert({**MPIJOB, **change})


def test_the_cli_prints_yaml_and_warns_on_stderr(tmp_path: Path) -> None:
    source = tmp_path / "mpijob.yaml"
    source.write_text(yaml.safe_dump(MPIJOB))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert hvjob(["convert", str(source)]) == 0
    assert yaml.safe_load(out.getvalue())["kind"] == "HorovodJob"
    assert "warning: the workers run the image's own sshd" in err.getvalue()
    with redirect_stderr(io.StringIO()) as err2:
        assert hvjob(["convert", str(tmp_path / "missing.yaml")]) == 1
    assert "error:" in err2.getvalue()


def test_a_multikueue_manager_carries_over_and_mpi_operators_own_is_dropped() -> None:
    dispatched = copy.deepcopy(MPIJOB)
    dispatched["spec"]["runPolicy"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    job, _ = convert(dispatched)
    assert parse_job(job).spec.managed_by == "kueue.x-k8s.io/multikueue"
    own = copy.deepcopy(MPIJOB)
    own["spec"]["runPolicy"]["managedBy"] = "kubeflow.org/mpi-operator"
    job, warnings = convert(own)
    assert "managedBy" not in job["spec"]
    assert any("this operator runs the job" in w for w in warnings)
