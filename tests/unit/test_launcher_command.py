"""The launcher's horovodrun line: ranks counted by the operator, never by hand."""

from typing import Any

import pytest

from horovod_operator.api import parse_job
from horovod_operator.builders import launcher_command

PREFIX = ["--hostfile", "/etc/horovod/config/hostfile", "-p", "2222"]
IDENTITY = ["--ssh-identity-file", "/etc/horovod/ssh/id_ed25519"]


@pytest.mark.parametrize(
    ("replicas", "slots", "command", "expected"),
    [
        (
            1,
            1,
            ["python", "t.py"],
            ["horovodrun", "-np", "1", *PREFIX, *IDENTITY, "python", "t.py"],
        ),
        (
            2,
            1,
            ["python", "-m", "m"],
            ["horovodrun", "-np", "2", *PREFIX, *IDENTITY, "python", "-m", "m"],
        ),
        (4, 8, ["x"], ["horovodrun", "-np", "32", *PREFIX, *IDENTITY, "x"]),
        (
            3,
            2,
            ["python", "train.py", "--lr=0.1", "a b"],
            ["horovodrun", "-np", "6", *PREFIX, *IDENTITY, "python", "train.py", "--lr=0.1", "a b"],
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
