"""The launcher's horovodrun line: ranks counted by the operator, never by hand."""

from typing import Any

import pytest

from horovod_operator.api import parse_job
from horovod_operator.builders import launcher_command

# horovod_worker.sshd --client-only prepares the keys and a host-key-checking ssh first.
CLIENT = ["python", "-m", "horovod_worker.sshd", "--client-only", "--"]
# Then the images' horovodrun (it skips horovodrun's framework-importing MPI probe).
HOROVODRUN = ["python", "-m", "horovod_worker.horovodrun"]
# The pods' only interface, which spares horovodrun its discovery over ssh.
NIC = ["--network-interfaces", "eth0"]
PREFIX = ["--hostfile", "/etc/horovod/config/hostfile", "-p", "2222", *NIC]


@pytest.mark.parametrize(
    ("replicas", "slots", "command", "expected"),
    [
        (
            1,
            1,
            ["python", "t.py"],
            [*CLIENT, *HOROVODRUN, "-np", "1", *PREFIX, "python", "t.py"],
        ),
        (
            2,
            1,
            ["python", "-m", "m"],
            [*CLIENT, *HOROVODRUN, "-np", "2", *PREFIX, "python", "-m", "m"],
        ),
        (4, 8, ["x"], [*CLIENT, *HOROVODRUN, "-np", "32", *PREFIX, "x"]),
        (
            3,
            2,
            ["python", "train.py", "--lr=0.1", "a b"],
            [*CLIENT, *HOROVODRUN, "-np", "6", *PREFIX, "python", "train.py", "--lr=0.1", "a b"],
        ),
    ],
)
def test_launcher_command(
    replicas: int, slots: int, command: list[str], expected: list[str]
) -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "j"},
        "spec": {
            "image": "i",
            "command": command,
            "slotsPerWorker": slots,
            "worker": {"replicas": replicas},
        },
    }
    assert launcher_command(parse_job(body).spec) == expected


def _spec(**extra: Any) -> Any:
    body: dict[str, Any] = {
        "metadata": {"name": "j"},
        "spec": {"image": "i", "command": ["python", "t.py"], "worker": {"replicas": 2}, **extra},
    }
    return parse_job(body).spec


def test_extra_horovodrun_args_go_between_the_generated_options_and_the_program() -> None:
    spec = _spec(launcher={"horovodrunArgs": ["--fusion-threshold-mb", "32", "--mpi-args=-x A"]})
    assert launcher_command(spec) == [
        *CLIENT, *HOROVODRUN, "-np", "2", *PREFIX,
        "--fusion-threshold-mb", "32", "--mpi-args=-x A", "python", "t.py",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "chosen",
    [
        ["--network-interfaces", "ib0"],
        ["--network-interface", "ib0"],
        ["--network-interfaces=ib0,eth0"],
    ],
)
def test_the_users_interfaces_replace_the_default(chosen: list[str]) -> None:
    command = launcher_command(_spec(launcher={"horovodrunArgs": chosen}))
    assert command[command.index("2222") + 1 :] == [*chosen, "python", "t.py"]


@pytest.mark.parametrize(
    "extra",
    [
        {"worker": {"replicas": 2, "template": {"spec": {"hostNetwork": True}}}},
        {"launcher": {"template": {"spec": {"hostNetwork": True}}}},
        {
            "worker": {
                "replicas": 2,
                "template": {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma"}}},
            }
        },
    ],
)
def test_pods_that_may_have_other_interfaces_keep_horovodruns_discovery(
    extra: dict[str, Any],
) -> None:
    """The node's interfaces (hostNetwork) or Multus' networks beside eth0."""
    command = launcher_command(_spec(**extra))
    assert not any(arg.startswith("--network-interface") for arg in command)


def test_an_image_with_its_own_sshd_gets_plain_horovodrun_on_its_port() -> None:
    """mpi-operator's images: no operator ssh helper in them, sshd on 22 by default."""
    spec = _spec(ssh={"authMountPath": "/home/mpiuser/.ssh"})
    hostfile = ["--hostfile", "/etc/horovod/config/hostfile"]
    assert launcher_command(spec) == [
        "horovodrun",
        "-np",
        "2",
        *hostfile,
        "-p",
        "22",
        *NIC,
        "python",
        "t.py",
    ]
    spec = _spec(ssh={"authMountPath": "/root/.ssh", "port": 2022})
    assert launcher_command(spec)[5:7] == ["-p", "2022"]
