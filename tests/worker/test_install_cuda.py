"""hack/install-worker.sh --cuda-from-wheels without a GPU, a compiler or a download:
the build environment it computes (--print-env) for a Python environment laid out
as the CUDA wheels lay it out, and the mismatches it refuses.

The environment is a real venv whose site-packages hold what the wheels would
install (dist-info metadata and empty libraries in their places); the CUDA
compiler is a toolkit folder whose nvcc only answers --version. Nothing is built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from localcluster.paths import REPO
from localcluster.versions import read_versions
from tests.support.prerequisites import skip_unless_ci

SCRIPT = REPO / "hack" / "install-worker.sh"


def dist_info(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip (the script checks for it): made once for the module."""
    root = tmp_path_factory.mktemp("venv")
    venv.create(root, with_pip=True, symlinks=True)
    return root / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.fixture
def cu13(python: Path) -> Path:
    """torch 2.13's CUDA 13 wheels as they lie in site-packages: runtime, NCCL."""
    site = site_packages(python)
    made = [
        site / "nvidia",
        *site.glob("torch-*.dist-info"),
        *site.glob("nvidia_*.dist-info"),
    ]
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    dist_info(site, "torch", "2.13.0")
    dist_info(site, "nvidia-cuda-runtime", "13.0.96")
    dist_info(site, "nvidia-nccl-cu13", "2.29.7")
    for name in ("libcudart.so.13", "libcudart_static.a", "libcudadevrt.a"):
        touch(site / "nvidia" / "cu13" / "lib" / name)
    touch(site / "nvidia" / "cu13" / "include" / "cuda_runtime.h")
    touch(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    touch(site / "nvidia" / "nccl" / "include" / "nccl.h")
    return site


def toolkit(root: Path, release: str) -> Path:
    """A CUDA toolkit folder (NVIDIA's layout) whose nvcc says it is `release`."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
    )
    nvcc.chmod(0o755)
    touch(root / "nvvm" / "bin" / "cicc")
    touch(root / "include" / "cuda_runtime.h")
    return root


def print_env(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for tool in ("cmake", "make", "g++", "patch"):
        if shutil.which(tool) is None:
            skip_unless_ci(f"{tool} is not installed (the script checks for the build tools)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CUDA_HOME"))}
    return subprocess.run(
        [
            str(SCRIPT),
            f"--python={python}",
            "--frameworks=pytorch",
            "--cuda-from-wheels",
            "--without-mpi",
            "--print-env",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def parsed(output: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for line in output.splitlines():
        for separator in (" -> ", "="):
            if separator in line:
                key, value = line.split(separator, 1)
                pairs[key] = value
                break
    return pairs


def test_build_env_points_at_the_wheels_own_nccl_and_runtime(
    python: Path, cu13: Path, tmp_path: Path
) -> None:
    compiler = toolkit(tmp_path / "cuda-13.0", "13.0")
    done = print_env(python, f"--cuda-compiler={compiler}")
    assert done.returncode == 0, done.stderr
    env = parsed(done.stdout)
    nv = cu13 / "nvidia"
    cc_list = read_versions()["HOROVOD_CUDA13_CC_LIST"]
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == cc_list
    assert env["HOROVOD_WITH_PYTORCH"] == "1" and env["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert env["HOROVOD_WITHOUT_MPI"] == "1" and env["HOROVOD_WITH_GLOO"] == "1"
    assert env["HOROVOD_NCCL_LINK"] == "SHARED"
    assert env["HOROVOD_NCCL_INCLUDE"] == str(nv / "nccl" / "include")
    assert env["HOROVOD_CUDA_HOME"] == env["CUDA_HOME"]
    # The run path: the wheels' directories, where they are at run time too.
    assert env["LDFLAGS"] == f"-Wl,-rpath,{nv / 'cu13' / 'lib'}:{nv / 'nccl' / 'lib'}"
    # The CUDA_HOME made for the build links the wheels' files, and the compiler's.
    assert env["CUDA_HOME/lib64/libcudart.so"] == str(nv / "cu13" / "lib" / "libcudart.so.13")
    assert env["CUDA_HOME/lib64/libcudadevrt.a"] == str(nv / "cu13" / "lib" / "libcudadevrt.a")
    assert env["CUDA_HOME/include/cuda_runtime.h"] == str(compiler / "include" / "cuda_runtime.h")
    assert env["CUDA_HOME/nvvm"] == str(compiler / "nvvm")
    assert env["HOROVOD_NCCL_LIB/libnccl.so"] == str(nv / "nccl" / "lib" / "libnccl.so.2")
    # The cache key names every input that changes the binary.
    key = env["HOROVOD_BUILD_KEY"]
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert key.startswith(f"horovod-0.28.1-{py}-torch2.13.0-nccl2.29.7-cudart13.0.96-nvcc13.0-cc")
    assert f"-cc{cc_list.replace(',', '.')}-patch" in key


def test_cc_list_option_wins_and_an_older_compiler_gets_an_empty_cudadevrt(
    python: Path, cu13: Path, tmp_path: Path
) -> None:
    # The runtime is 13.0; a 13.0 toolkit is no older, so take a runtime of 13.1.
    shutil.rmtree(next(cu13.glob("nvidia_cuda_runtime-*.dist-info")))
    dist_info(cu13, "nvidia-cuda-runtime", "13.1.80")
    done = print_env(
        python, f"--cuda-compiler={toolkit(tmp_path / 'c', '13.0')}", "--cuda-cc-list=90"
    )
    assert done.returncode == 0, done.stderr
    env = parsed(done.stdout)
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    # nvlink refuses a cudadevrt newer than the compiler: an empty archive of the build's own.
    assert not env["CUDA_HOME/lib64/libcudadevrt.a"].startswith(str(cu13))
    assert "an empty one" in done.stderr


@pytest.mark.parametrize(
    ("release", "message"),
    [
        ("12.4", "nvcc is CUDA 12.4 but the framework's runtime is CUDA 13.0.96: one CUDA major"),
        ("13.2", "nvcc is CUDA 13.2, newer than the framework's runtime 13.0.96"),
    ],
)
def test_a_compiler_of_another_cuda_is_refused(
    python: Path, cu13: Path, tmp_path: Path, release: str, message: str
) -> None:
    done = print_env(python, f"--cuda-compiler={toolkit(tmp_path / 'c', release)}")
    assert done.returncode == 1
    assert message in done.stderr


def test_cuda_12_needs_a_compiler_from_elsewhere(python: Path, cu13: Path) -> None:
    shutil.rmtree(cu13 / "nvidia" / "cu13")
    shutil.rmtree(next(cu13.glob("nvidia_cuda_runtime-*.dist-info")))
    dist_info(cu13, "nvidia-cuda-runtime-cu12", "12.9.79")
    touch(cu13 / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    done = print_env(python)
    assert done.returncode == 1
    assert "PyPI has no nvcc for CUDA 12" in done.stderr and "--cuda-compiler" in done.stderr


def test_missing_wheels_are_named(python: Path, cu13: Path) -> None:
    shutil.rmtree(cu13 / "nvidia" / "nccl")
    done = print_env(python, "--cuda-compiler=/nonexistent")
    assert done.returncode == 1
    assert "no NCCL wheel" in done.stderr
    shutil.rmtree(next(cu13.glob("nvidia_cuda_runtime-*.dist-info")))
    done = print_env(python)
    assert done.returncode == 1
    assert "no nvidia-cuda-runtime wheel" in done.stderr


def test_option_errors() -> None:
    done = subprocess.run(
        [str(SCRIPT), "--cuda-compiler=/opt/cuda"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "--cuda-compiler goes with --cuda-from-wheels" in done.stderr
    done = subprocess.run([str(SCRIPT), "--cuda-cc-list=sm_90"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "is not a comma-separated list of compute capabilities" in done.stderr
