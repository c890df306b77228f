"""hack/install-worker.sh --prebuilt: which of another machine's wheels a build takes
instead of compiling (hack/images.sh offers the host's to the CPU images).

The environment is a real venv with the frameworks' metadata only; --print-env
names the wheel the build would take (HOROVOD_PREBUILT) and exits before building.
That the taken wheel then works in an image is tests/worker/images' part.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.support.prerequisites import skip_unless_ci
from tests.worker.test_install_cuda import SCRIPT, dist_info, parsed, site_packages, touch


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding torch 2.13.0 and tensorflow-cpu 2.21.0 as metadata only."""
    root = tmp_path_factory.mktemp("venv")
    venv.create(root, with_pip=True, symlinks=True)
    python = root / "bin" / "python"
    site = site_packages(python)
    dist_info(site, "torch", "2.13.0")
    dist_info(site, "tensorflow-cpu", "2.21.0")
    return python


def print_env(python: Path, *args: str) -> dict[str, str]:
    for tool in ("cmake", "make", "g++", "patch"):
        if shutil.which(tool) is None:
            skip_unless_ci(f"{tool} is not installed (the script checks for the build tools)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    done = subprocess.run(
        [str(SCRIPT), f"--python={python}", "--without-mpi", "--print-env", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return parsed(done.stdout)


def wheel_under(root: Path, key: str) -> Path:
    return touch(root / key / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl")


def test_a_wheel_with_more_frameworks_at_the_same_pins_is_taken(
    python: Path, tmp_path: Path
) -> None:
    key = print_env(python, "--frameworks=pytorch")["HOROVOD_BUILD_KEY"]
    base, patch = key.split("-torch2.13.0")
    assert patch.startswith("-patch"), key
    both = wheel_under(tmp_path, f"{base}-torch2.13.0-tf2.21.0{patch}")
    # What must not be taken: another torch, NCCL, MPI (this build has none),
    # another patch. Named so that they sort before the one that fits.
    wheel_under(tmp_path, f"{base}-torch2.12.0{patch}")
    wheel_under(tmp_path, f"{base}-torch2.13.0-mpi-openmpi-4.1.4{patch}")
    wheel_under(tmp_path, f"{base}-torch2.13.0-nccl2.29.7-cc90{patch}")
    wheel_under(tmp_path, f"{base}-torch2.13.0-patch000000000000")
    for frameworks in ("pytorch", "tensorflow", "pytorch,tensorflow"):
        env = print_env(python, f"--frameworks={frameworks}", f"--prebuilt={tmp_path}")
        assert env["HOROVOD_PREBUILT"] == str(both), frameworks


def test_no_wheel_that_covers_the_build_means_a_compile(python: Path, tmp_path: Path) -> None:
    key = print_env(python, "--frameworks=tensorflow")["HOROVOD_BUILD_KEY"]
    base, patch = key.split("-tf2.21.0")
    wheel_under(tmp_path, f"{base}-torch2.13.0{patch}")  # no TensorFlow in it
    wheel_under(tmp_path, f"{base}-tf2.20.0{patch}")
    env = print_env(python, "--frameworks=tensorflow", f"--prebuilt={tmp_path}")
    assert env["HOROVOD_PREBUILT"] == ""
    assert "HOROVOD_PREBUILT" not in print_env(python, "--frameworks=tensorflow")


def test_prebuilt_refuses_nccl_builds(python: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), f"--python={python}", "--cuda-from-wheels", f"--prebuilt={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--prebuilt is for builds without NCCL" in done.stderr
