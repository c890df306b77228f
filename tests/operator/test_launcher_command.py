"""The launcher's horovodrun line: ranks counted by the operator, never by hand."""

from typing import Any

import pytest

from horovod_operator.api import parse_job
from horovod_operator.builders import launcher_command

# horovod_worker.sshd --client-only prepares the keys and a host-key-checking ssh first.
CLIENT = ["python", "-m", "horovod_worker.sshd", "--client-only", "--"]
PREFIX = ["--hostfile", "/etc/horovod/config/hostfile", "-p", "2222"]


@pytest.mark.parametrize(
    ("replicas", "slots", "command", "expected"),
    [
        (
            1,
            1,
            ["python", "t.py"],
            [*CLIENT, "horovodrun", "-np", "1", *PREFIX, "python", "t.py"],
        ),
        (
            2,
            1,
            ["python", "-m", "m"],
            [*CLIENT, "horovodrun", "-np", "2", *PREFIX, "python", "-m", "m"],
        ),
        (4, 8, ["x"], [*CLIENT, "horovodrun", "-np", "32", *PREFIX, "x"]),
        (
            3,
            2,
            ["python", "train.py", "--lr=0.1", "a b"],
            [*CLIENT, "horovodrun", "-np", "6", *PREFIX, "python", "train.py", "--lr=0.1", "a b"],
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
    spec = _spec(launcher={"horovodrunArgs": ["--network-interfaces", "eth0", "--mpi-args=-x A"]})
    assert launcher_command(spec) == [
        *CLIENT, "horovodrun", "-np", "2", *PREFIX,
        "--network-interfaces", "eth0", "--mpi-args=-x A", "python", "t.py",
    ]  # fmt: skip


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
        "python",
        "t.py",
    ]
    spec = _spec(ssh={"authMountPath": "/root/.ssh", "port": 2022})
    assert launcher_command(spec)[5:7] == ["-p", "2022"]
