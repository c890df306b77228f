"""The worker images of Dockerfile.worker, built and run with Docker (marker `images`).

Every image: the user and labels, `horovodrun --check-build` (its framework,
Gloo, MPI, and NCCL exactly when it is a GPU image), no compiler in it, and its
size within the budget of docs/images.md. The GPU images: Horovod's extension
linked against the image's one NCCL and its CUDA runtime (ldd), carrying CUDA
kernels for the compute capabilities of hack/versions.env (.nv_fatbin read
here: there is no cuobjdump). The CPU images: a HorovodJob as the operator would
run it, in containers instead of pods: the job's ssh keys as the Secret volume
holds them, its hostfile, two workers running the image's default command
(sshd) and a launcher running the operator's launcher command, all as uid 1000
on a user-defined network, training the digits example to accuracy >= 0.9 with
identical parameters on every rank.

No GPU is needed: the GPU images are built and inspected, not run on a GPU
(hack/gpu-check.sh proves NCCL on a GPU machine). Every question to an image goes
through its probe (probe.py), so that a machine without a GPU image can run these
tests on the answers a real build of the same inputs gave (conftest.py,
localcluster/image_record.py).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import horovod_contract as contract
from horovod_operator import builders, names
from horovod_operator.api import HorovodJob, parse_job
from horovod_operator.sshkeys import generate_key_pair
from horovod_worker.common import parse_result
from localcluster.paths import REPO
from tests.support.docker import remove
from tests.worker.images.conftest import WorkerImage

CPU_TARGETS = ("torch-cpu", "tf-cpu")
GPU_TARGETS = ("torch-gpu", "tf-gpu")
TARGETS = CPU_TARGETS + GPU_TARGETS
EXAMPLES = {
    "pytorch": REPO / "examples" / "pytorch-digits.yaml",
    "tensorflow": REPO / "examples" / "tensorflow-digits.yaml",
}
FEATURES = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}
# Uncompressed size (docker image inspect), measured in docs/images.md, plus room
# for patch releases of the wheels; a jump past it means something new came in.
SIZE_BUDGET_GB = {"torch-cpu": 6.0, "torch-gpu": 6.0, "tf-cpu": 2.5, "tf-gpu": 8.0}
# What a runtime image must not hold: compilers, linkers, build systems, and the
# Debian packages that bring them.
COMPILERS = ("gcc", "g++", "cc", "c++", "cpp", "nvcc", "cicc", "cmake", "make", "ld", "as")
BUILD_PACKAGES = re.compile(
    r"^(gcc(-\d+)?|g\+\+(-\d+)?|cpp(-\d+)?|binutils.*|cmake|make|build-essential|"
    r"libopenmpi-dev|python3(\.\d+)?-dev|libc6-dev|linux-libc-dev)$"
)
# Horovod's extension in each framework's package (in the venv's site-packages).
EXTENSIONS = {
    "pytorch": "horovod/torch/mpi_lib_v2.*.so",
    "tensorflow": "horovod/tensorflow/mpi_lib.*.so",
}
CUDA_MAJOR = {"pytorch": 13, "tensorflow": 12}
# Importing these loads Horovod's extension (horovod.torch's __init__ alone would not).
LOADS = {
    "pytorch": "import torch, horovod.torch as hvd; from horovod.torch import mpi_lib_v2",
    "tensorflow": "import tensorflow, horovod.tensorflow as hvd",
}
SITE = "/opt/venv/lib/python3.11/site-packages"

WorkerImages = Callable[[str], WorkerImage]


def check_build(image: WorkerImage) -> dict[str, bool]:
    """`horovodrun --check-build` in the image: feature -> built (ticked)."""
    done = image.probe.run("horovodrun", "--check-build", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ticks = re.findall(r"^\s*\[( |X)\] (.+?)\s*$", done.stdout, re.M)
    assert ticks, done.stdout
    return {name: mark == "X" for mark, name in ticks}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(3600)
def test_image_runs_as_uid_1000_with_its_labels(worker_image: WorkerImages, target: str) -> None:
    image = worker_image(target)
    assert image.user == "1000:1000"
    version = subprocess.run(
        [str(REPO / "hack" / "images.sh"), "version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    labels = image.labels
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.title"] == "horovod-worker"
    assert labels["ai.horovod.worker.framework"] == image.framework
    assert labels["ai.horovod.worker.variant"] == ("gpu" if image.gpu else "cpu")
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels["org.opencontainers.image.revision"])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(3600)
def test_check_build_lists_the_framework_gloo_mpi_and_nccl_on_gpu(
    worker_image: WorkerImages, target: str
) -> None:
    image = worker_image(target)
    built = check_build(image)
    assert built[FEATURES[image.framework]], built
    assert built["Gloo"] and built["MPI"], built
    assert built["NCCL"] is image.gpu, built
    # --check-build ticks a framework whenever `import horovod.<framework>` works,
    # and Horovod 0.28.1's horovod.torch imports without its extension (it prints
    # a warning): tf-cpu shows [X] PyTorch. The extensions themselves, then: only
    # the image's framework's.
    listing = image.probe.run("sh", "-c", f"cd {SITE} && ls horovod/*/mpi_lib*.so")
    extensions = listing.stdout.split()
    assert len(extensions) == 1, listing.stdout + listing.stderr
    assert fnmatch.fnmatch(extensions[0], EXTENSIONS[image.framework]), extensions
    # And it loads, after its framework (as a trainer imports them).
    nccl = nccl_built(image)
    assert (nccl > 0) is image.gpu, nccl


def nccl_built(image: WorkerImage) -> int:
    """Load Horovod's extension after its framework; hvd.nccl_built(): the NCCL
    version it was compiled against (2.29.7 -> 22907), 0 without NCCL."""
    load = LOADS[image.framework] + "; print(int(hvd.nccl_built()))"
    loaded = image.probe.run("python", "-c", load)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return int(loaded.stdout.split()[-1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(3600)
def test_runtime_image_has_no_compiler(worker_image: WorkerImages, target: str) -> None:
    image = worker_image(target)
    script = (
        f"for tool in {' '.join(COMPILERS)}; do command -v $tool; done; "
        "find / -xdev \\( -name nvcc -o -name cicc -o -name 'cudafe++' -o -name 'cc1*' \\) -print; "
        "echo ---; dpkg-query -W -f '${Package}\\n'"
    )
    done = image.probe.run("sh", "-c", script, options=("--user=0",))
    found, _, packages = done.stdout.partition("---\n")
    assert found.strip() == "", f"compilers in {image.name}:\n{found}"
    installed = packages.split()
    assert "openssh-server" in installed and "openmpi-bin" in installed, installed
    assert [p for p in installed if BUILD_PACKAGES.match(p)] == []


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.timeout(3600)
def test_image_size_is_within_its_budget(worker_image: WorkerImages, target: str) -> None:
    image = worker_image(target)
    print(f"{image.name}: {image.size / 1e9:.2f} GB (budget {SIZE_BUDGET_GB[target]} GB)")
    assert image.size <= SIZE_BUDGET_GB[target] * 1e9


def ldd_resolutions(output: str) -> dict[str, str]:
    """`ldd` lines `name => path (address)` as name -> path ("not found" kept)."""
    resolved: dict[str, str] = {}
    for line in output.splitlines():
        match = re.match(r"\s*(\S+) => (not found|\S+)", line)
        if match:
            resolved[match.group(1)] = match.group(2)
    return resolved


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.timeout(3600)
def test_gpu_image_links_its_one_nccl_and_cuda_runtime_with_kernels(
    worker_image: WorkerImages, target: str
) -> None:
    image = worker_image(target)
    major = CUDA_MAJOR[image.framework]
    pattern = f"{SITE}/{EXTENSIONS[image.framework]}"
    script = (
        f"set -e; ext=$(ls {pattern}); echo $ext; echo ---; ldd $ext; echo ---; "
        "find / -xdev \\( -name 'libnccl.so*' -o -name 'libcudart.so*' -o -name 'libnccl_static*' "
        "-o -name 'libcudart_static*' \\) -print | sort"
    )
    done = image.probe.run("sh", "-c", script, options=("--user=0",))
    assert done.returncode == 0, done.stdout + done.stderr
    extension, ldd, libraries = (part.strip() for part in done.stdout.split("---\n"))
    resolved = ldd_resolutions(ldd)
    found = libraries.splitlines()
    print(f"{extension}\n{ldd}\n{libraries}")

    # One NCCL in the whole image, the framework's nvidia-nccl wheel, and the
    # extension resolves to it; the CUDA runtime is the framework's wheel too.
    nccl = [path for path in found if Path(path).name.startswith("libnccl")]
    assert nccl == [f"{SITE}/nvidia/nccl/lib/libnccl.so.2"], found
    assert resolved.get("libnccl.so.2") == nccl[0], ldd
    cudart = [path for path in found if Path(path).name.startswith("libcudart.so")]
    assert cudart and all(path.endswith(f"libcudart.so.{major}") for path in cudart), found
    assert len(cudart) == 1 and cudart[0].startswith(f"{SITE}/nvidia/"), found
    if f"libcudart.so.{major}" in resolved:
        assert resolved[f"libcudart.so.{major}"] == cudart[0], ldd
    # Everything resolves but TensorFlow's own libraries, which Horovod links by
    # path without a run path: `import tensorflow` has loaded them before.
    unresolved = {name for name, path in resolved.items() if path == "not found"}
    assert unresolved <= {"libtensorflow_framework.so.2", "libtensorflow_cc.so.2"}, ldd
    # Every CUDA library the extension reaches comes from the framework's wheels.
    cuda_libs = {n: p for n, p in resolved.items() if re.match(r"lib(cu|nv|nccl)", n)}
    assert all(path.startswith(f"{SITE}/") for path in cuda_libs.values()), cuda_libs

    # One CUDA major in the image: the framework's wheels, none of the other major.
    listed = image.probe.run("pip", "list", "--format=json")
    nvidia = {
        d["name"]: d["version"]
        for d in json.loads(listed.stdout)
        if d["name"].startswith("nvidia-")
    }
    if major == 13:
        assert nvidia["nvidia-cuda-runtime"].startswith("13."), nvidia
        assert [name for name in nvidia if name.endswith("-cu12")] == [], nvidia
    else:
        assert nvidia["nvidia-cuda-runtime-cu12"].startswith("12."), nvidia
        assert [n for n in nvidia if n.endswith("-cu13") or n == "nvidia-cuda-runtime"] == []
    assert [name for name in nvidia if name.startswith("nvidia-nccl")] == [f"nvidia-nccl-cu{major}"]
    # Horovod was compiled against that same NCCL (its nccl.h).
    nccl_major, nccl_minor, nccl_patch = (
        int(n) for n in nvidia[f"nvidia-nccl-cu{major}"].split(".")[:3]
    )
    assert nccl_built(image) == nccl_major * 10000 + nccl_minor * 100 + nccl_patch

    # The extension itself, read here: what it needs, and its CUDA kernels.
    dynamic = image.probe.readelf(extension, "-d")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert "libnccl.so.2" in needed, dynamic
    # The run path names the wheels' own folders, and none that anyone could make
    # at run time (the build's scratch folders under /tmp were, once).
    runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*?)\]", dynamic)
    assert runpath is not None, dynamic
    entries = runpath.group(1).split(":")
    assert f"{SITE}/nvidia/nccl/lib" in entries, entries
    assert [e for e in entries if e.startswith(("/tmp", "/var/tmp", "/dev/shm"))] == []
    sections = image.probe.readelf(extension, "-S", "-W")
    assert re.search(r"\]\s+\.nv_fatbin\s", sections), sections
    fatbin = image.probe.fatbin(extension)
    assert fatbin is not None
    entries = {(str(kind), int(arch)) for kind, arch in fatbin}
    print(f"NEEDED {needed}\nfat binary entries {sorted(entries)}")
    cubins = {arch for kind, arch in entries if kind == "elf"}
    ptx = {arch for kind, arch in entries if kind == "ptx"}
    assert cubins == set(image.cc_list), sorted(entries)
    assert ptx == {max(image.cc_list)}, sorted(entries)


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.timeout(3600)
def test_cpu_image_run_paths_name_only_the_images_own_folders(
    worker_image: WorkerImages, target: str
) -> None:
    """A CPU image may hold the host's Horovod wheel (hack/images.sh stages it,
    install-worker.sh --prebuilt installs it): its run path must not keep a folder
    of the machine that built it (its venv's torch/lib), which a user of the image
    could create (a volume at that path) and fill with libraries of their own."""
    image = worker_image(target)
    extension = f"{SITE}/{EXTENSIONS[image.framework]}"
    listed = image.probe.run("sh", "-c", f"ls {extension}")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    dynamic = image.probe.readelf(listed.stdout.strip(), "-d")
    runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*?)\]", dynamic)
    entries = runpath.group(1).split(":") if runpath else []
    print(f"{target}: run path {entries}")
    own = ("/usr/", "$ORIGIN/", f"{SITE}/")
    assert [entry for entry in entries if not entry.startswith(own)] == [], dynamic


# ---- a HorovodJob in containers -------------------------------------------------


def example_job(framework: str, image: str) -> HorovodJob:
    """The framework's digits example as the operator parses it, in namespace default."""
    body = yaml.safe_load(EXAMPLES[framework].read_text())
    body["metadata"].update(namespace="default", uid=str(uuid.uuid4()))
    body["spec"]["image"] = image
    if image.endswith("-cpu"):
        # The CPU images run without GPUs: ask for none, as the kind rung's CPU variant
        # does (a rank whose pod asked for GPUs and sees none refuses to train).
        body["spec"]["worker"].pop("resources", None)
    return parse_job(body)


def secret_volume(job: HorovodJob, into: Path) -> Path:
    """The job's `<job>-ssh` Secret as kubelet mounts it (files 0444, defaultMode)."""
    secret = builders.new_ssh_secret(
        job, generate_key_pair(), generate_key_pair(comment="horovod-host")
    )
    into.mkdir(mode=0o755)
    for key, value in secret["data"].items():
        (into / key).write_bytes(base64.b64decode(value))
        (into / key).chmod(0o444)
    return into


def config_volume(job: HorovodJob, into: Path) -> Path:
    """The job's `<job>-config` ConfigMap as kubelet mounts it."""
    config = builders.new_config_map(job)
    into.mkdir(mode=0o755)
    for key, value in config["data"].items():
        (into / key).write_text(value)
        (into / key).chmod(0o755 if key == names.DISCOVER_HOSTS else 0o444)
    return into


def env_options(container: dict[str, Any]) -> list[str]:
    return [f"--env={item['name']}={item['value']}" for item in container["env"]]


class ProcessWatch:
    """Samples `docker top` of some containers until stopped: every process seen."""

    def __init__(self, docker: str, containers: list[str]) -> None:
        self.docker = docker
        self.containers = containers
        self.seen: dict[str, set[tuple[str, str]]] = {name: set() for name in containers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.containers:
                # ps columns: docker top needs the PID one to pick the container's rows.
                done = subprocess.run(
                    [self.docker, "top", name, "-eo", "uid,pid,args"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                for line in done.stdout.splitlines()[1:]:
                    fields = line.split(None, 2)
                    if len(fields) == 3:
                        self.seen[name].add((fields[0], fields[2]))
            self._stop.wait(0.3)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def wait_for_sshd(docker: str, container: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    logs = ""
    while time.monotonic() < deadline:
        done = subprocess.run([docker, "logs", container], capture_output=True, text=True)
        logs = done.stdout + done.stderr
        if f"Server listening on 0.0.0.0 port {contract.SSH_PORT}" in logs:
            return
        state = subprocess.run(
            [docker, "inspect", "-f", "{{.State.Running}}", container],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert state == "true", f"{container} exited:\n{logs}"
        time.sleep(0.5)
    raise AssertionError(f"sshd did not listen in {container} within {timeout}s:\n{logs}")


@pytest.fixture
def network(docker: str) -> Iterator[str]:
    """A user-defined bridge network (Docker's DNS resolves container names and aliases)."""
    name = f"hvk-{uuid.uuid4().hex[:8]}"
    subprocess.run([docker, "network", "create", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run([docker, "network", "rm", name], capture_output=True)


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.timeout(3600)
def test_cpu_image_trains_the_digits_example_over_ssh_as_uid_1000(
    docker: str, worker_image: WorkerImages, network: str, target: str, tmp_path: Path
) -> None:
    image = worker_image(target)
    job = example_job(image.framework, image.name)
    assert job.spec.total_slots() == 2
    ssh_dir = secret_volume(job, tmp_path / "ssh")
    config_dir = config_volume(job, tmp_path / "config")
    mounts = [
        f"--volume={ssh_dir}:{contract.SSH_MOUNT_PATH}:ro",
        f"--volume={config_dir}:{names.CONFIG_MOUNT_PATH}:ro",
    ]
    suffix = uuid.uuid4().hex[:6]
    workers: list[str] = []
    launcher_name = f"{names.launcher_name(job.metadata.name)}-{suffix}"
    try:
        for index in range(job.spec.worker.replicas):
            pod = builders.new_worker_pod(job, index, attempt=0)
            spec = pod["spec"]
            (container,) = spec["containers"]
            # The pod's command is the image's default one: run the image without one.
            assert container["command"] == list(contract.WORKER_SSHD_COMMAND)
            name = f"{pod['metadata']['name']}-{suffix}"
            subprocess.run(
                [
                    docker,
                    "run",
                    "--detach",
                    f"--name={name}",
                    f"--network={network}",
                    f"--hostname={spec['hostname']}",
                    # The name the hostfile uses (the headless Service's DNS name).
                    f"--network-alias={names.worker_host(job.metadata.name, 'default', index)}",
                    *mounts,
                    *env_options(container),
                    image.name,
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            workers.append(name)
        for name in workers:
            wait_for_sshd(docker, name)

        launcher_job = builders.new_launcher_job(job, attempt=0)
        (launcher,) = launcher_job["spec"]["template"]["spec"]["containers"]
        command = builders.launcher_command(job.spec)
        assert launcher["command"] == command
        run = [
            docker,
            "run",
            f"--name={launcher_name}",
            f"--network={network}",
            *mounts,
            *env_options(launcher),
            image.name,
            *command,
        ]
        with ProcessWatch(docker, [*workers, launcher_name]) as watch:
            done = subprocess.run(run, capture_output=True, text=True, timeout=900)
        output = done.stdout + done.stderr
        logs = {
            name: subprocess.run([docker, "logs", name], capture_output=True, text=True)
            for name in workers
        }
        worker_logs = "\n".join(f"--- {n}\n{d.stdout}{d.stderr}" for n, d in logs.items())
        assert done.returncode == 0, f"launcher:\n{output[-8000:]}\n{worker_logs[-4000:]}"
    finally:
        remove(docker, launcher_name, *workers)

    result = parse_result(output)
    accuracy, rate = result["test_accuracy"], result["samples_per_sec"]
    print(f"{target}: accuracy {accuracy:.4f}, {rate:.0f} samples/s")
    assert result["size"] == 2
    assert result["framework"] == image.framework
    assert result["test_accuracy"] >= 0.9, result
    # Every rank started from rank 0's weights and ended with the same ones.
    assert len(result["param_checksums"]) == 2
    assert len(set(result["param_checksums"])) == 1, result["param_checksums"]
    assert len(set(result["initial_checksums"])) == 1, result["initial_checksums"]
    # One rank on each worker, reached by ssh from the launcher.
    assert sorted(result["hostnames"]) == sorted(
        names.worker_name(job.metadata.name, i) for i in range(2)
    )
    # Every process seen in the three containers ran as uid 1000: sshd and the
    # ranks on the workers, horovodrun, mpirun and ssh on the launcher.
    for name, processes in watch.seen.items():
        uids = {uid for uid, _ in processes}
        assert uids == {"1000"}, f"{name}: {sorted(processes)}"
    for name in workers:
        commands = " ".join(args for _, args in watch.seen[name])
        assert "sshd" in commands and "horovod_worker.train" in commands, watch.seen[name]
    launched = " ".join(args for _, args in watch.seen[launcher_name])
    assert "horovodrun" in launched
    print(f"launcher ran {'mpirun' if 'mpirun' in launched else 'Gloo'} over ssh")
