"""The one Go builder: every binary the tooling needs, built from a pinned go.mod.

Each tool is a directory under hack/tools whose go.mod pins the upstream module;
its binaries land in ~/.cache/horovod-operator/bin/<tool>-<version>/ with a stamp
of the go.mod, go.sum and link flags, so a warm build takes milliseconds and a
changed pin rebuilds. Builds take a machine-wide lock: two Go compiles at once on
a 2-core machine only make both slower.

The stamped binaries are the cache. Go's own build cache (compiled packages) is
one directory shared by every tool (~/.cache/horovod-operator/go-build), so the
standard library and the modules several tools share compile once per run, and
kubelet reuses what the control plane compiled from the same go.mod: after a build
that leaves it over HVK_GO_BUILD_CACHE_MAX_GB (10 GB), its oldest entries go. Left
unbounded in ~/.cache/go-build it grew past 13 GB across the peers and
schedulers, and the disk a kind rung needs for its images was gone. A GOCACHE
the user set is used as it is and never emptied.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .paths import CACHE, TOOLS_DIR
from .versions import go_module_version, read_versions

HEAVY_LOCK = Path("/tmp/heavy-build.lock")
# hack/warm-up.sh builds the Go tools ahead of the tests in this cgroup, whose cpu.idle
# gives it CPU only when nothing else wants it.
WARM_UP_IDLE = Path("/sys/fs/cgroup/cpu/warm-up/cpu.idle")


class BuildError(RuntimeError):
    """A tool could not be built; the message says how to fix it."""


def log(msg: str) -> None:
    print(f"[gobuild] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Tool:
    """One go.mod under hack/tools and the binaries built from it (name -> package)."""

    name: str
    binaries: dict[str, str]
    # Where the version comes from: a key of hack/versions.env, or else the
    # version the go.mod requires of `module`.
    version_key: str = ""
    module: str = ""
    # Go packages whose version variables are stamped at link time, as the upstream
    # release build does; without them kubectl refuses the "v0.0.0-master" it would report.
    version_packages: tuple[str, ...] = ()
    # Packages whose k8sVersionMajor/Minor say which Kubernetes `helm template` and
    # `helm lint` assume without a cluster (helm's Makefile sets them from its client-go).
    kube_version_packages: tuple[str, ...] = ()
    # Variables that hold the plain version string (helm's own `helm version`).
    version_vars: tuple[str, ...] = ()
    # Built by `hack/cluster.sh build`; the others when their user first needs them.
    control_plane: bool = True
    # The hack/tools directory when it is not `name` (two tools from one go.mod).
    directory: str = ""
    # Go build tags (runc's seccomp support; containerd without snapshotters it never uses).
    tags: tuple[str, ...] = ()

    @property
    def go_dir(self) -> Path:
        return TOOLS_DIR / (self.directory or self.name)

    def version(self) -> str:
        if self.version_key:
            return read_versions()[self.version_key]
        return go_module_version(self.go_dir / "go.mod", self.module)

    def bin_dir(self) -> Path:
        return CACHE / "bin" / f"{self.name}-{self.version()}"

    def ldflags(self) -> str:
        version = self.version()
        flags = ["-s", "-w", *(f"-X {var}={version}" for var in self.version_vars)]
        if self.kube_version_packages:
            kube_minor = go_module_version(self.go_dir / "go.mod", "k8s.io/client-go").split(".")[1]
            for pkg in self.kube_version_packages:
                flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={kube_minor}"]
        major, minor = version.lstrip("v").split(".")[:2]
        for pkg in self.version_packages:
            flags += [
                f"-X {pkg}.{k}={v}"
                for k, v in (
                    ("gitVersion", version),
                    ("gitMajor", major),
                    ("gitMinor", minor),
                    ("gitTreeState", "clean"),
                    ("buildDate", "1970-01-01T00:00:00Z"),
                )
            ]
        return " ".join(flags)

    def stamp(self) -> str:
        digest = hashlib.sha256(f"{self.ldflags()} tags={','.join(self.tags)}".encode())
        for name in ("go.mod", "go.sum", "main.go"):
            path = self.go_dir / name
            if path.exists():
                digest.update(path.read_bytes())
        return digest.hexdigest()

    def built(self) -> bool:
        out = self.bin_dir()
        stamp = out / ".stamp"
        return (
            stamp.exists()
            and stamp.read_text() == self.stamp()
            and all((out / b).exists() for b in self.binaries)
        )


# Kubeflow Trainer v2 (its module path has a major-version suffix).
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"


TOOLS = (
    Tool(
        "kubernetes",
        {
            name: f"k8s.io/kubernetes/cmd/{name}"
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        },
        version_key="KUBERNETES_VERSION",
        version_packages=("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"),
    ),
    # etcd's server module root is the etcd main package.
    Tool("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}, version_key="ETCD_VERSION"),
    Tool("kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}, version_key="KWOK_VERSION"),
    Tool(
        "helm",
        {"helm": "helm.sh/helm/v3/cmd/helm"},
        version_key="HELM_VERSION",
        kube_version_packages=("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"),
        version_vars=("helm.sh/helm/v3/internal/version.version",),
    ),
    # The node agent's cluster DNS: a main package linking only the plugins it uses.
    Tool("coredns", {"coredns": "."}, module="github.com/coredns/coredns", control_plane=False),
    # A real node (tests/e2e/kind): kind itself, and what its node image runs. The
    # node binaries come from the control plane's own go.mod, so they match it.
    Tool(
        "kubernetes-node",
        {name: f"k8s.io/kubernetes/cmd/{name}" for name in ("kubelet", "kubeadm", "kube-proxy")},
        version_key="KUBERNETES_VERSION",
        version_packages=("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"),
        control_plane=False,
        directory="kubernetes",
    ),
    Tool("kind", {"kind": "sigs.k8s.io/kind"}, module="sigs.k8s.io/kind", control_plane=False),
    Tool(
        "containerd",
        {
            name: f"github.com/containerd/containerd/v2/cmd/{name}"
            for name in ("containerd", "ctr", "containerd-shim-runc-v2")
        },
        module="github.com/containerd/containerd/v2",
        tags=("no_aufs", "no_zfs", "no_btrfs", "no_devmapper"),
        control_plane=False,
    ),
    # cgo: runc's nsenter is C, and seccomp (pods asking RuntimeDefault) needs libseccomp.
    Tool(
        "runc",
        {"runc": "github.com/opencontainers/runc"},
        module="github.com/opencontainers/runc",
        tags=("seccomp",),
        version_vars=("main.version",),
        control_plane=False,
    ),
    Tool(
        "cri-tools",
        {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"},
        module="sigs.k8s.io/cri-tools",
        control_plane=False,
    ),
    Tool(
        "cni-plugins",
        {
            name: f"github.com/containernetworking/plugins/plugins/{kind}/{name}"
            for kind, name in (
                ("main", "bridge"),
                ("main", "loopback"),
                ("ipam", "host-local"),
                ("meta", "portmap"),
            )
        },
        module="github.com/containernetworking/plugins",
        control_plane=False,
    ),
    # Kueue's controller manager: the queue that admits a HorovodJob as one Workload
    # (localcluster/kueue.py runs it against the local control plane).
    Tool(
        "kueue",
        {"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
        module="sigs.k8s.io/kueue",
        control_plane=False,
    ),
    # scheduler-plugins' kube-scheduler with the coscheduling plugin, run as a second
    # scheduler against the local control plane (localcluster/coscheduling.py).
    # v0.35.4-devel: the newest tag on the proxy, k8s deps v1.35.4 (the last release,
    # v0.34.7, is on v1.34.7), so the nearest to the v1.37 control plane.
    Tool(
        "scheduler-plugins",
        {"kube-scheduler-plugins": "sigs.k8s.io/scheduler-plugins/cmd/scheduler"},
        module="sigs.k8s.io/scheduler-plugins",
        control_plane=False,
    ),
    # Volcano's scheduler (vc-scheduler), run against the local control plane for
    # gang.policy Volcano (localcluster/gangs.py). v1.14.1: the newest release whose
    # volcano.sh/apis (a nested module of the volcano repository) the proxy serves.
    Tool(
        "volcano",
        {"vc-scheduler": "volcano.sh/volcano/cmd/scheduler"},
        module="volcano.sh/volcano",
        control_plane=False,
    ),
    # The benchmark's peer, built from the module proxy as released.
    Tool(
        "mpi-operator",
        {"mpi-operator": "github.com/kubeflow/mpi-operator/cmd/mpi-operator"},
        module="github.com/kubeflow/mpi-operator",
        control_plane=False,
    ),
    # The benchmark's second peer: Kubeflow Trainer v2's controller manager and the
    # JobSet controller its TrainJobs run on (localcluster/trainer.py;
    # docs/benchmarks/trainer-v2.md).
    Tool(
        "trainer",
        {"trainer-controller-manager": f"{TRAINER_MODULE}/cmd/trainer-controller-manager"},
        module=TRAINER_MODULE,
        control_plane=False,
    ),
    Tool(
        "jobset",
        {"jobset-controller": "sigs.k8s.io/jobset"},
        module="sigs.k8s.io/jobset",
        control_plane=False,
    ),
)


def tool(name: str) -> Tool:
    for candidate in TOOLS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no tool {name!r} under {TOOLS_DIR}")


def bin_path(binary: str) -> Path:
    """Where a built binary is (whether or not it is built yet)."""
    for candidate in TOOLS:
        if binary in candidate.binaries:
            return candidate.bin_dir() / binary
    raise KeyError(binary)


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOMODCACHE", str(Path.home() / ".cache" / "go-mod"))
    # -mod=mod lets go.sum be completed on a machine whose module cache is empty.
    env["GOFLAGS"] = "-mod=mod -trimpath -buildvcs=false"
    return env


def module_dir(module: str, version: str) -> Path:
    """Where the module cache keeps a downloaded module's sources."""
    return Path(go_env()["GOMODCACHE"]) / f"{module}@{version}"


def module_source(module: str, version: str) -> Path:
    """A module's sources in the module cache, downloaded from the proxy when missing
    (its CRDs and configuration, read before anything of it is built)."""
    root = module_dir(module, version)
    if root.is_dir():
        return root
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"{module}@{version} is not in the module cache and `go` is not on PATH. "
            "Fix: install Go 1.26 or newer, or run hack/bootstrap.sh"
        )
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        env=go_env(),
        cwd="/",
        text=True,
        capture_output=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0 or not root.is_dir():
        raise BuildError(
            f"go mod download {module}@{version} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}\nFix: check that the Go module "
            "proxy (GOPROXY) is reachable"
        )
    return root


@contextlib.contextmanager
def _heavy_lock() -> Iterator[None]:
    with HEAVY_LOCK.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Most likely the warm-up's build of this very tool, at idle priority: with
            # the tests' two streams beside it, it could take longer than the waiting
            # test's timeout. It gets a normal share of the CPU until this one goes on.
            raised = set_idle(WARM_UP_IDLE, False)
            if raised:
                log("waiting for the warm-up's build, now at normal CPU priority")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            finally:
                if raised:
                    set_idle(WARM_UP_IDLE, True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def set_idle(knob: Path, idle: bool) -> bool:
    """Set a cgroup's cpu.idle; whether this changed it (False where there is none, it
    is not ours to write, or it already was so)."""
    want = "1" if idle else "0"
    try:
        if knob.read_text().strip() == want:
            return False
        knob.write_text(want)
    except OSError:
        return False
    return True


SHARED_CACHE_MAX_GB = 10.0


def shared_cache() -> Path:
    return CACHE / "go-build"


@contextlib.contextmanager
def _build_cache() -> Iterator[dict[str, str]]:
    """go_env() with GOCACHE set: the caller's own when set, else the shared one,
    trimmed afterwards when it has grown past its cap (a failed build's too)."""
    env = go_env()
    if "GOCACHE" in env:
        yield env
        return
    cache = shared_cache()
    env["GOCACHE"] = str(cache)
    try:
        yield env
    finally:
        _trim(cache)


# Over its cap the cache keeps its newest entries down to this share of the cap.
TRIM_TO: Final = 0.7


def _trim(cache: Path) -> None:
    """Oldest entries first, down to TRIM_TO of the cap. Emptying it (as before
    2026-12-05) made every later tool of a cold run compile the standard library and
    the shared modules again (the cap was reached after scheduler-plugins, with
    Volcano and five more tools to go). Go's own trim also drops single files: an
    action whose output file is gone is a miss, not an error. Go refreshes an entry's
    mtime when it is used (at most hourly), so the oldest are the least used."""
    cap = float(os.environ.get("HVK_GO_BUILD_CACHE_MAX_GB") or SHARED_CACHE_MAX_GB) * 1e9
    files = _files(cache)
    size = sum(st.st_size for _, st in files)
    if size <= cap:
        return
    keep = cap * TRIM_TO
    for path, st in sorted(files, key=lambda entry: entry[1].st_mtime):
        if size <= keep:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            size -= st.st_size
    log(f"Go build cache {cache} was over its cap ({cap / 1e9:g} GB): oldest entries "
        f"removed, {size / 1e9:.1f} GB kept")  # fmt: skip


def _files(root: Path) -> list[tuple[Path, os.stat_result]]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            with contextlib.suppress(OSError):
                found.append((path, path.lstat()))
    return found


def build(names: Sequence[str] = ()) -> None:
    """Build the named tools (default: the control plane's), each only when stale."""
    wanted = [t for t in TOOLS if (t.name in names if names else t.control_plane)]
    unknown = set(names) - {t.name for t in TOOLS}
    if unknown:
        raise BuildError(f"unknown tools {sorted(unknown)}; known: {[t.name for t in TOOLS]}")
    for candidate in wanted:
        if candidate.built():
            log(f"{candidate.name} {candidate.version()}: cached in {candidate.bin_dir()}")
            continue
        _build_one(candidate)


def _build_one(candidate: Tool) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"{candidate.name} is not built and `go` is not on PATH. Fix: install Go 1.26 or "
            "newer (https://go.dev/doc/install), or run hack/bootstrap.sh."
        )
    out = candidate.bin_dir()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with _heavy_lock():
        if candidate.built():
            # Built by another process (hack/warm-tools.sh) while this one waited.
            log(f"{candidate.name} {candidate.version()}: built meanwhile in {candidate.bin_dir()}")
            return
        _compile(go, candidate, out)
        # Under the lock: a process waiting for it sees the tool built.
        (out / ".stamp").write_text(candidate.stamp())
    log(f"{candidate.name}: built in {time.monotonic() - start:.0f}s")


# One binary's longest build: tests wait for builds outside their own timeout
# (pyproject's timeout_func_only), so a build that hangs is stopped here. The slowest
# measured, cold and starved by both test streams: scheduler-plugins, 1,641 s.
BUILD_TIMEOUT_S: Final = 3600.0


def _build_timeout() -> float:
    return float(os.environ.get("HVK_GO_BUILD_TIMEOUT") or BUILD_TIMEOUT_S)


def _compile(go: str, candidate: Tool, out: Path) -> None:
    with _build_cache() as env:
        for name, package in candidate.binaries.items():
            log(f"{candidate.name} {candidate.version()}: building {package} (minutes when cold)")
            tags = [f"-tags={','.join(candidate.tags)}"] if candidate.tags else []
            try:
                proc = _go_build(go, candidate, tags, out / name, package, env)
            except subprocess.TimeoutExpired as error:
                raise BuildError(
                    f"building {package} took over {_build_timeout():.0f}s and was stopped. "
                    "Fix: look for another heavy process on the machine, or raise "
                    "HVK_GO_BUILD_TIMEOUT on a slow one."
                ) from error
            if proc.returncode != 0:
                raise BuildError(
                    f"building {package} failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\nFix: check that the Go module proxy is reachable "
                    f"and that `go version` is at least the `go` line of "
                    f"{candidate.go_dir / 'go.mod'}."
                )


def _go_build(
    go: str, candidate: Tool, tags: list[str], out: Path, package: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [go, "build", *tags, f"-ldflags={candidate.ldflags()}", "-o", str(out), package],
        cwd=candidate.go_dir,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
        timeout=_build_timeout(),
    )


def ensure(binary: str) -> Path:
    """A binary's path, built first when it is missing or stale."""
    for candidate in TOOLS:
        if binary in candidate.binaries:
            if not candidate.built():
                _build_one(candidate)
            return candidate.bin_dir() / binary
    raise KeyError(binary)


def link_bins(target: Path) -> None:
    """Symlink every built control-plane binary into `target` (for PATH)."""
    target.mkdir(parents=True, exist_ok=True)
    for candidate in TOOLS:
        if not candidate.control_plane:
            continue
        for name in candidate.binaries:
            link = target / name
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to(candidate.bin_dir() / name)
