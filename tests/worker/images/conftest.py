"""The worker images (Dockerfile.worker), built once per session by hack/images.sh.

`worker_image(target)` builds horovod-worker:<version>-<target> the first time a
test asks for it (with Docker's build cache: cold on a fresh machine, seconds
when nothing changed) and returns what the tests read from it. A GPU image is a
large build: the tests that need one carry a long timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from localcluster.versions import read_versions
from tests.support.docker import images, inspect_image

# The longest a build may take here (a cold GPU image on 2 cores is the longest).
BUILD_TIMEOUT = 3600


@dataclass
class WorkerImage:
    target: str
    name: str
    user: str
    labels: dict[str, str]
    env: dict[str, str]
    size: int
    build_log: str = field(repr=False)

    @property
    def framework(self) -> str:
        return "pytorch" if self.target.startswith("torch") else "tensorflow"

    @property
    def gpu(self) -> bool:
        return self.target.endswith("-gpu")

    @property
    def cc_list(self) -> list[int]:
        """The compute capabilities Horovod's CUDA kernels were built for (versions.env)."""
        key = "HOROVOD_CUDA13_CC_LIST" if self.framework == "pytorch" else "HOROVOD_CUDA12_CC_LIST"
        return [int(cc) for cc in read_versions()[key].split(",")]


@pytest.fixture(scope="session")
def worker_image(docker: str) -> Callable[[str], WorkerImage]:
    built: dict[str, WorkerImage] = {}

    def get(target: str) -> WorkerImage:
        if target not in built:
            done = images("worker", target, timeout=BUILD_TIMEOUT)
            assert done.returncode == 0, (
                f"hack/images.sh worker {target} failed:\n{done.stderr[-6000:]}"
            )
            name = f"horovod-worker:{images('version').stdout.strip()}-{target}"
            inspected: dict[str, Any] = inspect_image(docker, name)
            config = inspected["Config"]
            env = dict(item.split("=", 1) for item in config.get("Env") or [])
            built[target] = WorkerImage(
                target=target,
                name=name,
                user=config["User"],
                labels=config["Labels"] or {},
                env=env,
                size=int(inspected["Size"]),
                build_log=done.stderr,
            )
            took = re.search(r"built \S+ in (\d+)s", done.stderr)
            print(f"{name}: {took.group(1) if took else '?'} s to build, {built[target].size} B")
        return built[target]

    return get
