"""Docker for the image tests: hack/images.sh as a function, and the session
fixture `docker` (a pytest plugin, registered by tests/conftest.py).

`docker` runs `hack/images.sh engine`, which starts a Docker engine when none
answers; one it started is stopped at the end of the session, one that was
running already is left alone. Where no engine can be had (no root to install or
start one), tests that need it are skipped on a developer's machine and fail
under CI=1.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.paths import REPO
from tests.support.prerequisites import skip_unless_ci

IMAGES = REPO / "hack" / "images.sh"


def images(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """hack/images.sh ARGS, from the repository root, output captured."""
    return subprocess.run(
        [str(IMAGES), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="session")
def docker() -> Iterator[str]:
    """The docker CLI hack/images.sh uses, with a daemon answering it."""
    running_before = images("status").returncode == 0
    engine = images("engine")
    if engine.returncode != 0:
        skip_unless_ci(f"no Docker engine (hack/images.sh engine):\n{engine.stderr[-2000:]}")
    cli = images("cli")
    assert cli.returncode == 0, cli.stderr
    try:
        yield cli.stdout.strip()
    finally:
        if not running_before:
            stopped = images("engine-stop")
            assert stopped.returncode == 0, stopped.stderr


def inspect_image(docker: str, name: str) -> dict[str, Any]:
    """`docker image inspect NAME`, the one object."""
    done = subprocess.run(
        [docker, "image", "inspect", name], capture_output=True, text=True, check=True
    )
    inspected: dict[str, Any] = json.loads(done.stdout)[0]
    return inspected


def run_in_image(
    docker: str, image: str, *command: str, timeout: float = 300, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`docker run --rm [OPTIONS] IMAGE COMMAND...`, output captured (not checked)."""
    return subprocess.run(
        [docker, "run", "--rm", *options, image, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def remove(docker: str, *containers: str) -> None:
    """Force-remove containers, whatever state they are in (or none)."""
    if containers:
        subprocess.run(
            [docker, "rm", "--force", *containers], capture_output=True, text=True, timeout=120
        )
