"""The worker's install script, its pins and patch, and the Dockerfile that uses them."""

import hashlib
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from localcluster.paths import REPO
from localcluster.versions import read_versions
from tests.support.prerequisites import skip_unless_ci

SCRIPT = REPO / "hack" / "install-worker.sh"
PATCH = REPO / "hack" / "patches" / "horovod-0.28.1.patch"
SDIST = Path.home() / ".cache" / "horovod-operator" / "wheels" / "sdist" / "horovod-0.28.1.tar.gz"


def test_worker_versions_are_pinned_in_versions_env() -> None:
    pins = read_versions()
    for key in (
        "HOROVOD_VERSION",
        "HOROVOD_SDIST_SHA256",
        "TORCH_VERSION",
        "TORCHVISION_VERSION",
        "TENSORFLOW_VERSION",
        "TF_KERAS_VERSION",
        "SCIKIT_LEARN_VERSION",
        "NUMPY_VERSION",
        "HOROVOD_CUDA13_CC_LIST",
        "HOROVOD_CUDA12_CC_LIST",
        "CUDA12_NVCC_DEBIAN_VERSION",
    ):
        assert pins.get(key), key
    assert pins["HOROVOD_VERSION"] == "0.28.1"
    # Keras 3 breaks horovod.tensorflow.keras: tf-keras must match TensorFlow.
    assert pins["TF_KERAS_VERSION"] == pins["TENSORFLOW_VERSION"]
    for key in ("HOROVOD_CUDA13_CC_LIST", "HOROVOD_CUDA12_CC_LIST"):
        assert re.fullmatch(r"\d+(,\d+)*", pins[key]), key
    # nvcc 12.4 (Debian's) knows nothing after sm_90.
    assert max(int(cc) for cc in pins["HOROVOD_CUDA12_CC_LIST"].split(",")) <= 90


def test_dockerfile_builds_with_the_install_scripts() -> None:
    text = (REPO / "Dockerfile.worker").read_text()
    # The frameworks in their own layers, Horovod built by install-worker.sh after them.
    assert len(re.findall(r"hack/install-frameworks\.sh --python /opt/venv/bin/python", text)) == 3
    builds = re.findall(r"hack/install-worker\.sh --python /opt/venv/bin/python [^\n]*", text)
    assert len(builds) == 4 and all("--skip-frameworks" in line for line in builds)
    assert len(re.findall(r"--cuda-from-wheels", text)) == 2
    assert "--cuda-compiler /opt/cuda12-nvcc" in text
    assert 'CMD ["python", "-m", "horovod_worker.sshd"]' in text
    assert "openssh-server" in text and "libopenmpi-dev" in text
    assert re.findall(r"^FROM (\S+)", text, re.M).count("debian:bookworm-slim") == 2
    # Each image is its frameworks stage plus the wheel its build stage verified: the
    # frameworks layer is shared, never copied (no `COPY --from=...build /opt/venv`).
    assert len(re.findall(r"--skip-frameworks --wheel-dir /wheelhouse", text)) == 4
    assert len(re.findall(r"--mount=type=bind,from=\S+-build,source=/wheelhouse", text)) == 4
    assert "/opt/venv /opt/venv" not in text


def test_script_is_valid_bash_with_help_and_clear_argument_errors() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    shown = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--nccl" in shown.stdout and "--python" in shown.stdout
    bad = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "[install-worker] error: unknown argument: --bogus (see --help)"
    bad = subprocess.run([str(SCRIPT), "--frameworks=mxnet"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown framework 'mxnet'" in bad.stderr


def test_missing_python_is_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), f"--python={tmp_path}/nope/python"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert f"no Python at {tmp_path}/nope/python" in done.stderr


FRAMEWORKS_SCRIPT = REPO / "hack" / "install-frameworks.sh"


def _fake_python(tmp_path: Path, pip_install: str, imports_ok: bool) -> tuple[Path, Path]:
    """A `python` for install-frameworks.sh: pip answers with `pip_install` (shell),
    `-c 'import ...'` succeeds or not, and every call is recorded."""
    calls = tmp_path / "calls"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >>{calls}\n'
        'if [[ "$1 $2 $3" == "-m pip --version" ]]; then exit 0; fi\n'
        f'if [[ "$1 $2 $3" == "-m pip install" ]]; then {pip_install}; fi\n'
        f'if [[ "$1" == -c && "$2" == import\\ sys* ]]; then echo {tmp_path}; exit 0; fi\n'
        f'if [[ "$1" == -c ]]; then exit {0 if imports_ok else 1}; fi\n'
        "cat >/dev/null; exit 0\n"  # pip_installed: a script on stdin, nothing installed
    )
    python.chmod(0o755)
    return python, calls


def test_frameworks_stop_at_once_on_a_full_disk(tmp_path: Path) -> None:
    # Seen in a Docker build: a retry found the half-written packages "already
    # satisfied" and the script reported the frameworks ready without TensorFlow.
    python, calls = _fake_python(
        tmp_path,
        "echo 'ERROR: Could not install packages due to an OSError: [Errno 28] No space "
        "left on device'; exit 1",
        imports_ok=False,
    )
    done = subprocess.run(
        [str(FRAMEWORKS_SCRIPT), "--python", str(python), "--frameworks", "tensorflow"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "no space left on the disk" in done.stderr and "Fix: free space" in done.stderr
    assert calls.read_text().count("-m pip install") == 1, "a full disk is not retried"


def test_frameworks_that_do_not_import_are_not_ready(tmp_path: Path) -> None:
    python, _ = _fake_python(tmp_path, "exit 0", imports_ok=False)
    done = subprocess.run(
        [str(FRAMEWORKS_SCRIPT), "--python", str(python), "--frameworks", "pytorch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "'import torch, torchvision' fails" in done.stderr
    assert "frameworks ready" not in done.stderr


def test_frameworks_come_from_the_wheelhouse_once_it_is_filled(tmp_path: Path) -> None:
    """--wheelhouse: pip downloads into it first, then installs from it alone
    (no index); --download-only stops after the download (bootstrap's prefetch)."""
    python, calls = _fake_python(tmp_path, "exit 0", imports_ok=True)
    house = tmp_path / "wheelhouse"

    def pip_runs(calls: Path) -> list[str]:
        lines = calls.read_text().splitlines()
        return [c for c in lines if c.startswith(("-m pip download", "-m pip install"))]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(FRAMEWORKS_SCRIPT), "--python", str(python), "--frameworks", "pytorch", *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )

    done = run("--wheelhouse", str(house), "--download-only")
    assert done.returncode == 0, done.stderr
    pip_calls = pip_runs(calls)
    assert len(pip_calls) == 1 and pip_calls[0].startswith("-m pip download ")
    assert f"-d {house} " in pip_calls[0] and "torch==" in pip_calls[0]
    assert house.is_dir()

    calls.unlink()
    done = run("--wheelhouse", str(house))
    assert done.returncode == 0, done.stderr
    pip_calls = pip_runs(calls)
    assert [c.split()[2] for c in pip_calls] == ["download", "install"], pip_calls
    assert f"--no-index --find-links {house} " in pip_calls[1]

    refused = run("--download-only")
    assert refused.returncode == 1
    assert "--download-only needs --wheelhouse DIR" in refused.stderr


def test_patch_applies_to_the_pinned_sdist(tmp_path: Path) -> None:
    if not SDIST.exists():
        skip_unless_ci(f"{SDIST} not downloaded yet (hack/install-worker.sh downloads it)")
    if shutil.which("patch") is None:
        skip_unless_ci("patch not installed")
    assert hashlib.sha256(SDIST.read_bytes()).hexdigest() == read_versions()["HOROVOD_SDIST_SHA256"]
    with tarfile.open(SDIST) as archive:
        archive.extractall(tmp_path, filter="data")
    source = tmp_path / "horovod-0.28.1"
    done = subprocess.run(
        ["patch", "-p1", "-d", str(source)], stdin=PATCH.open(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "set(CMAKE_CXX_STANDARD 17)" in (source / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in (source / "horovod/torch/CMakeLists.txt").read_text()
    xla = (source / "horovod/tensorflow/xla_mpi_ops.cc").read_text()
    assert (
        "#if TENSORFLOW_VERSION >= 2006000000 && TENSORFLOW_VERSION < 2019000000 && HAVE_GPU" in xla
    )
    ops = (source / "horovod/tensorflow/mpi_ops.cc").read_text()
    assert "stream->platform_specific_handle().stream" in ops
