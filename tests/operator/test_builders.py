"""Builders: each child object compared whole, table-driven over specs."""

import base64
from typing import Any

import pytest

from horovod_operator import builders
from horovod_operator.api import HorovodJob, parse_job
from horovod_operator.sshkeys import KeyPair, generate_key_pair

OWNER = {
    "apiVersion": "horovod.ai/v1alpha1",
    "kind": "HorovodJob",
    "name": "mnist",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
BASE_LABELS = {"horovod.ai/job-name": "mnist", "app.kubernetes.io/managed-by": "horovod-operator"}
ENV_WORKER = [
    {"name": "HVJOB_NAME", "value": "mnist"},
    {"name": "HVJOB_NAMESPACE", "value": "team"},
    {"name": "HVJOB_ROLE", "value": "worker"},
    {"name": "HVJOB_EXPECTED_SIZE", "value": "4"},
    # The job asks for 2 GPUs per worker: a rank that sees none refuses the CPU.
    {"name": "HVJOB_GPUS_PER_WORKER", "value": "2"},
]
VOLUMES = [
    {"name": "horovod-ssh", "secret": {"secretName": "mnist-ssh", "defaultMode": 0o444}},
    {
        "name": "horovod-config",
        "configMap": {
            "name": "mnist-config",
            "items": [
                {"key": "hostfile", "path": "hostfile"},
                {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o755},
            ],
        },
    },
]
MOUNTS = [
    {"name": "horovod-ssh", "mountPath": "/etc/horovod/ssh", "readOnly": True},
    {"name": "horovod-config", "mountPath": "/etc/horovod/config", "readOnly": True},
]


def make_job(**spec: Any) -> HorovodJob:
    merged: dict[str, Any] = {
        "image": "horovod-worker:0.1.0",
        "command": ["python", "-m", "horovod_worker.train"],
        "slotsPerWorker": 2,
        "worker": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}},
        **spec,
    }
    return parse_job(
        {
            "metadata": {"name": "mnist", "namespace": "team", "uid": "uid-1"},
            "spec": merged,
        }
    )


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_ssh_secret() -> None:
    keys = KeyPair(private_openssh="PRIVATE\n", public_openssh="ssh-ed25519 AAA op\n")
    host = KeyPair(private_openssh="HOST\n", public_openssh="ssh-ed25519 HHH host\n")
    assert builders.new_ssh_secret(make_job(), keys, host) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "mnist-ssh",
            "namespace": "team",
            "labels": BASE_LABELS,
            "ownerReferences": [OWNER],
        },
        "type": "Opaque",
        "data": {
            "id_ed25519": b64("PRIVATE\n"),
            "id_ed25519.pub": b64("ssh-ed25519 AAA op\n"),
            "authorized_keys": b64("ssh-ed25519 AAA op\n"),
            "ssh_host_ed25519_key": b64("HOST\n"),
            "known_hosts": b64("* ssh-ed25519 HHH host\n"),
        },
    }


def test_generated_keys_are_openssh_ed25519() -> None:
    first, second = generate_key_pair(), generate_key_pair()
    assert first.private_openssh.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert first.public_openssh.startswith("ssh-ed25519 ")
    assert first != second  # fresh per job


@pytest.mark.parametrize(
    ("spec", "hostfile", "script"),
    [
        (
            {},
            "mnist-worker-0.mnist-worker.team.svc slots=2\n"
            "mnist-worker-1.mnist-worker.team.svc slots=2\n",
            "#!/bin/sh\necho mnist-worker-0.mnist-worker.team.svc:2\n"
            "echo mnist-worker-1.mnist-worker.team.svc:2\n",
        ),
        (
            {"slotsPerWorker": 1, "worker": {"replicas": 1}},
            "mnist-worker-0.mnist-worker.team.svc slots=1\n",
            "#!/bin/sh\necho mnist-worker-0.mnist-worker.team.svc:1\n",
        ),
    ],
)
def test_config_map(spec: dict[str, Any], hostfile: str, script: str) -> None:
    assert builders.new_config_map(make_job(**spec)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "mnist-config",
            "namespace": "team",
            "labels": BASE_LABELS,
            "ownerReferences": [OWNER],
        },
        "data": {"hostfile": hostfile, "discover_hosts.sh": script},
    }


def test_worker_service() -> None:
    assert builders.new_worker_service(make_job()) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "mnist-worker",
            "namespace": "team",
            "labels": BASE_LABELS,
            "ownerReferences": [OWNER],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"horovod.ai/job-name": "mnist", "horovod.ai/role": "worker"},
            "ports": [{"name": "ssh", "port": 2222, "targetPort": 2222, "protocol": "TCP"}],
        },
    }


# Our sshd: a readiness probe that waits for its banner (the kubelet runs it as soon
# as the container runs), then checks it every half minute.
OUR_SSHD_PROBE = {
    "readinessProbe": {
        "exec": {
            "command": [
                *("python", "-m", "horovod_worker.sshd"),
                *("--port", "2222", "--wait-listening", "10"),
            ]
        },
        "periodSeconds": 30,
        "timeoutSeconds": 15,
    }
}
# A template's own command or an image's own sshd: a TCP connect every second.
TCP_SSHD_PROBE = {"readinessProbe": {"tcpSocket": {"port": 2222}, "periodSeconds": 1}}


def expected_worker(index: int, attempt: int = 0, **overrides: Any) -> dict[str, Any]:
    container = {
        "name": "worker",
        "image": "horovod-worker:0.1.0",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": ENV_WORKER,
        "volumeMounts": MOUNTS,
        "command": ["python", "-m", "horovod_worker.sshd"],
        "resources": {"limits": {"nvidia.com/gpu": 2}},
        "ports": [{"name": "ssh", "containerPort": 2222, "protocol": "TCP"}],
        **overrides.pop("probe", OUR_SSHD_PROBE),
        **overrides.pop("container", {}),
    }
    spec = {
        "restartPolicy": "Never",
        "volumes": VOLUMES,
        "containers": [container],
        "hostname": f"mnist-worker-{index}",
        "subdomain": "mnist-worker",
        **overrides.pop("spec", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"mnist-worker-{index}",
            "namespace": "team",
            "labels": {
                **BASE_LABELS,
                "horovod.ai/role": "worker",
                "horovod.ai/worker-index": str(index),
                "horovod.ai/job-uid": "uid-1",
                "horovod.ai/attempt": str(attempt),
                **overrides.pop("labels", {}),
            },
            "ownerReferences": [OWNER],
        },
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "index", "attempt", "expected"),
    [
        ({}, 0, 0, expected_worker(0)),
        ({}, 1, 3, expected_worker(1, attempt=3)),
        (
            {"scheduling": {"schedulerName": "volcano", "priorityClassName": "hi", "queue": "q"}},
            0,
            0,
            expected_worker(
                0,
                spec={"schedulerName": "volcano", "priorityClassName": "hi"},
                labels={"kueue.x-k8s.io/queue-name": "q"},
            ),
        ),
        (
            # A user template: its labels, nodeSelector, command, env and resources are kept;
            # the operator's env and labels win where they collide.
            {
                "worker": {
                    "replicas": 2,
                    "resources": {"limits": {"nvidia.com/gpu": 2}},
                    "template": {
                        "metadata": {"labels": {"team": "ml", "horovod.ai/role": "x"}},
                        "spec": {
                            "nodeSelector": {"gpu": "a100"},
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "custom:1",
                                    "command": ["/usr/sbin/sshd", "-D"],
                                    "env": [
                                        {"name": "NCCL_DEBUG", "value": "INFO"},
                                        {"name": "HVJOB_ROLE", "value": "bogus"},
                                    ],
                                    "resources": {"limits": {"memory": "8Gi"}},
                                }
                            ],
                        },
                    },
                }
            },
            0,
            0,
            expected_worker(
                0,
                labels={"team": "ml", "horovod.ai/role": "worker"},
                spec={"nodeSelector": {"gpu": "a100"}},
                probe=TCP_SSHD_PROBE,
                container={
                    "image": "custom:1",
                    "command": ["/usr/sbin/sshd", "-D"],
                    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, *ENV_WORKER],
                    "resources": {"limits": {"memory": "8Gi", "nvidia.com/gpu": 2}},
                },
            ),
        ),
    ],
)
def test_worker_pod(spec: dict[str, Any], index: int, attempt: int, expected: Any) -> None:
    pod = builders.new_worker_pod(make_job(**spec), index, attempt)
    # Key order inside the pod spec does not matter to the API server.
    assert pod == expected


def test_worker_template_is_not_mutated() -> None:
    template = {"spec": {"containers": [{"name": "worker"}]}}
    job = make_job(worker={"replicas": 1, "template": template})
    builders.new_worker_pod(job, 0, 0)
    assert template == {"spec": {"containers": [{"name": "worker"}]}}


def expected_launcher(command: list[str], attempt: int = 0, **overrides: Any) -> dict[str, Any]:
    labels = {
        **BASE_LABELS,
        "horovod.ai/role": "launcher",
        "horovod.ai/job-uid": "uid-1",
        "horovod.ai/attempt": str(attempt),
    }
    env = [
        {**item, "value": "launcher"} if item["name"] == "HVJOB_ROLE" else item
        for item in ENV_WORKER
    ] + [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"}]
    container = {
        "name": "launcher",
        "image": "horovod-worker:0.1.0",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": env,
        "volumeMounts": MOUNTS,
        "command": command,
        **overrides.pop("container", {}),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "mnist-launcher",
            "namespace": "team",
            "labels": labels,
            "ownerReferences": [OWNER],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "volumes": VOLUMES, "containers": [container]},
            },
        },
    }


HOROVODRUN = [
    "python",
    "-m",
    "horovod_worker.sshd",
    "--client-only",
    "--",
    "python",
    "-m",
    "horovod_worker.horovodrun",
    "-np",
    "4",
    "--hostfile",
    "/etc/horovod/config/hostfile",
    "-p",
    "2222",
    "--network-interfaces",
    "eth0",
    "python",
    "-m",
    "horovod_worker.train",
]


@pytest.mark.parametrize(
    ("spec", "attempt", "expected"),
    [
        ({}, 0, expected_launcher(HOROVODRUN)),
        ({}, 2, expected_launcher(HOROVODRUN, attempt=2)),
        (
            # A full launcher template overrides the generated command.
            {
                "launcher": {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "main", "image": "mine:2", "command": ["mpirun", "x"]}
                            ]
                        }
                    }
                }
            },
            0,
            expected_launcher(["mpirun", "x"], container={"name": "main", "image": "mine:2"}),
        ),
    ],
)
def test_launcher_job(spec: dict[str, Any], attempt: int, expected: Any) -> None:
    assert builders.new_launcher_job(make_job(**spec), attempt) == expected


# --- launchMode: gloo --------------------------------------------------------------------

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONFIG_VOLUME = VOLUMES[1]
CONFIG_MOUNT = MOUNTS[1]


def gloo_job(**spec: Any) -> HorovodJob:
    return make_job(launchMode="gloo", **spec)


def gloo_worker_env(index: int, timeout: str = "1200") -> list[dict[str, str]]:
    return [
        *ENV_WORKER,
        {
            "name": "HVJOB_GLOO_RENDEZVOUS",
            "value": "mnist-launcher.mnist-worker.team.svc:2223",
        },
        {"name": "HVJOB_GLOO_RENDEZVOUS_TIMEOUT", "value": timeout},
        {"name": "HVJOB_WORKER_INDEX", "value": str(index)},
        {"name": "HVJOB_WORKER_HOST", "value": f"mnist-worker-{index}.mnist-worker.team.svc"},
        {"name": "HVJOB_WORKER_COUNT", "value": "2"},
        {"name": "HVJOB_SLOTS_PER_WORKER", "value": "2"},
    ]


def expected_gloo_worker(index: int, **overrides: Any) -> dict[str, Any]:
    """No ssh volume, port, probe or sshd; the ranks' starter; restricted security."""
    pod = expected_worker(index)
    container = {
        "name": "worker",
        "image": "horovod-worker:0.1.0",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": gloo_worker_env(index, overrides.pop("timeout", "1200")),
        "resources": {"limits": {"nvidia.com/gpu": 2}},
        "command": [
            "python",
            "-m",
            "horovod_worker.gloo_worker",
            "--",
            "python",
            "-m",
            "horovod_worker.train",
        ],
        "securityContext": RESTRICTED_CONTAINER,
        **overrides.pop("container", {}),
    }
    pod["spec"] = {
        "restartPolicy": "Never",
        "containers": [container],
        "hostname": f"mnist-worker-{index}",
        "subdomain": "mnist-worker",
        "securityContext": RESTRICTED_POD,
        **overrides.pop("spec", {}),
    }
    assert not overrides
    return pod


@pytest.mark.parametrize(
    ("spec", "index", "expected"),
    [
        ({}, 0, expected_gloo_worker(0)),
        ({}, 1, expected_gloo_worker(1)),
        # The rendezvous wait is the attempt's startup timeout (a year when disabled).
        ({"runPolicy": {"startupTimeoutSeconds": 90}}, 0, expected_gloo_worker(0, timeout="90")),
        (
            {"runPolicy": {"startupTimeoutSeconds": None}},
            0,
            expected_gloo_worker(0, timeout=str(366 * 24 * 3600)),
        ),
        (
            # The template's own security settings win; the rest is added.
            {
                "worker": {
                    "replicas": 2,
                    "resources": {"limits": {"nvidia.com/gpu": 2}},
                    "template": {
                        "spec": {
                            "securityContext": {"runAsUser": 1234},
                            "initContainers": [{"name": "fetch", "image": "busybox"}],
                            "containers": [
                                {
                                    "name": "worker",
                                    "securityContext": {"readOnlyRootFilesystem": True},
                                }
                            ],
                        }
                    },
                }
            },
            0,
            expected_gloo_worker(
                0,
                spec={
                    "securityContext": {"runAsUser": 1234, **RESTRICTED_POD},
                    "initContainers": [
                        {
                            "name": "fetch",
                            "image": "busybox",
                            "securityContext": RESTRICTED_CONTAINER,
                        }
                    ],
                },
                container={
                    "securityContext": {"readOnlyRootFilesystem": True, **RESTRICTED_CONTAINER}
                },
            ),
        ),
    ],
)
def test_gloo_worker_pod(spec: dict[str, Any], index: int, expected: Any) -> None:
    assert builders.new_worker_pod(gloo_job(**spec), index, 0) == expected


def test_gloo_worker_pod_has_nothing_of_ssh() -> None:
    pod = builders.new_worker_pod(gloo_job(), 0, 0)
    text = repr(pod)
    for word in ("ssh", "2222", "readinessProbe", "volumes", "OMPI"):
        assert word not in text, word


def test_gloo_launcher_job() -> None:
    job = builders.new_launcher_job(gloo_job(), 1)
    expected = expected_launcher(
        [
            "python",
            "-m",
            "horovod_worker.gloo_launcher",
            "--hostfile",
            "/etc/horovod/config/hostfile",
            "--port",
            "2223",
        ],
        attempt=1,
        container={
            "env": [
                {**item, "value": "launcher"} if item["name"] == "HVJOB_ROLE" else item
                for item in ENV_WORKER
            ],
            "volumeMounts": [CONFIG_MOUNT],
            "ports": [{"name": "rendezvous", "containerPort": 2223, "protocol": "TCP"}],
            "securityContext": RESTRICTED_CONTAINER,
        },
    )
    pod_spec = expected["spec"]["template"]["spec"]
    pod_spec.update(
        volumes=[CONFIG_VOLUME],
        # Found by the workers as mnist-launcher.mnist-worker.team.svc.
        hostname="mnist-launcher",
        subdomain="mnist-worker",
        securityContext=RESTRICTED_POD,
    )
    assert job == expected


def test_gloo_service_selects_the_launcher_too() -> None:
    service = builders.new_worker_service(gloo_job())
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"horovod.ai/job-name": "mnist"},
        "ports": [{"name": "rendezvous", "port": 2223, "targetPort": 2223, "protocol": "TCP"}],
    }


MPI_OPERATOR_KEYS = {
    "secretName": "mnist-ssh",
    "defaultMode": 0o600,
    "items": [
        {"key": "id_ed25519", "path": "id_rsa"},
        {"key": "id_ed25519.pub", "path": "id_rsa.pub"},
        {"key": "authorized_keys", "path": "authorized_keys"},
    ],
}


def test_an_image_with_its_own_sshd_gets_the_keys_as_mpi_operator_mounts_them() -> None:
    """ssh.authMountPath: images written for mpi-operator run unchanged."""
    worker_template = {
        "spec": {"containers": [{"name": "worker", "command": ["/usr/sbin/sshd", "-De"]}]}
    }
    job = make_job(
        ssh={"authMountPath": "/home/mpiuser/.ssh"},
        worker={"replicas": 2, "template": worker_template},
    )
    pod = builders.new_worker_pod(job, 0, 0)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["/usr/sbin/sshd", "-De"], "the image's sshd, as written"
    assert {"name": "horovod-ssh", "secret": MPI_OPERATOR_KEYS} in pod["spec"]["volumes"]
    assert {
        "name": "horovod-ssh",
        "mountPath": "/home/mpiuser/.ssh",
        "readOnly": True,
    } in container["volumeMounts"]
    assert container["ports"] == [{"name": "ssh", "containerPort": 22, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 22}
    assert builders.new_worker_service(job)["spec"]["ports"][0]["port"] == 22
    launcher = builders.new_launcher_job(job, 0)["spec"]["template"]["spec"]
    assert launcher["containers"][0]["command"][0] == "horovodrun"
    assert {"name": "horovod-ssh", "secret": MPI_OPERATOR_KEYS} in launcher["volumes"]


def test_an_image_with_its_own_sshd_and_no_command_runs_its_entrypoint() -> None:
    pod = builders.new_worker_pod(make_job(ssh={"authMountPath": "/root/.ssh", "port": 2022}), 0, 0)
    container = pod["spec"]["containers"][0]
    assert "command" not in container
    assert container["readinessProbe"]["tcpSocket"] == {"port": 2022}
    assert "exec" not in container["readinessProbe"], "the image may not have our module"


@pytest.mark.parametrize("kind", ["readinessProbe", "startupProbe"])
def test_a_template_probe_replaces_ours(kind: str) -> None:
    own = {"tcpSocket": {"port": 2222}, "periodSeconds": 7}
    template = {"spec": {"containers": [{"name": "worker", kind: own}]}}
    container = builders.new_worker_pod(make_job(worker={"template": template}), 0, 0)["spec"][
        "containers"
    ][0]
    assert container["command"] == ["python", "-m", "horovod_worker.sshd"]
    assert {k: v for k, v in container.items() if k.endswith("Probe")} == {kind: own}
