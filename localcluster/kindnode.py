"""A kind node image from local parts only, for hosts that reach no image registry.

kind's own node images (`kindest/node`) and every image they preload come from
registries. This builds the same thing here: kind's base-image files (from the
`sigs.k8s.io/kind` module), Debian packages, and every binary built by
`gobuild` from a pinned Go module: containerd, runc, crictl, the CNI plugins,
kubelet/kubeadm/kubectl, and the control-plane images kubeadm runs
(kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd,
CoreDNS, pause), preloaded into the node's containerd as kind does. Steps:

1. the binaries (`gobuild`, cached), and `pause` compiled from the Kubernetes
   module's `build/pause/linux/pause.c`;
2. one image per component (hack/kind/component.Dockerfile) under the name
   kubeadm asks for; etcd and CoreDNS keep their own versions, and `config()`
   tells kubeadm those tags;
3. the node (hack/kind/node.Dockerfile), then a container of it whose
   containerd imports the component images (`--no-unpack`, pinned, as kind's
   `build node-image` does), committed as `image_name()`.

The result is labelled with a digest of its inputs: an unchanged build is skipped.
docs/dev/kind-node-image.md has the why of each setting.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import gobuild
from .paths import CACHE, HACK
from .versions import go_module_version, read_versions

KIND_DIR = HACK / "kind"
INPUTS_LABEL = "ai.horovod.kind-node.inputs"
REPOSITORY = "horovod-kind-node"


class NodeImageError(RuntimeError):
    """The node image could not be built; the message says what to fix."""


def log(msg: str) -> None:
    print(f"[kind-node] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Component:
    """A control-plane image: the binary in it, the name kubeadm pulls, packages it needs."""

    binary: str
    image: str
    packages: str = ""


def kubernetes_version() -> str:
    return read_versions()["KUBERNETES_VERSION"]


def etcd_tag() -> str:
    return read_versions()["ETCD_VERSION"]


def coredns_tag() -> str:
    return go_module_version(
        gobuild.tool("coredns").go_dir / "go.mod", "github.com/coredns/coredns"
    )


def kind_version() -> str:
    return gobuild.tool("kind").version()


def image_name() -> str:
    return f"{REPOSITORY}:{kubernetes_version()}"


def components(pause_image: str) -> list[Component]:
    k8s = kubernetes_version()
    registry = "registry.k8s.io"
    return [
        *(
            Component(name, f"{registry}/{name}:{k8s}")
            for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
        ),
        Component(
            "kube-proxy", f"{registry}/kube-proxy:{k8s}", packages="iptables conntrack nftables"
        ),
        Component("etcd", f"{registry}/etcd:{etcd_tag()}"),
        Component("coredns", f"{registry}/coredns/coredns:{coredns_tag()}"),
        Component("pause", pause_image),
    ]


def config() -> str:
    """The kind cluster config for this image: kubeadm is told the etcd and CoreDNS
    tags it carries, and the kubelet may run on a cgroup v1 host (kubelet 1.35+
    refuses one unless told)."""
    return f"""\
# kind config for {image_name()} (made by `hack/kind.sh config`; see docs/dev/kind-node-image.md)
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
- |
  kind: ClusterConfiguration
  etcd:
    local:
      imageTag: {etcd_tag()}
  dns:
    imageTag: {coredns_tag()}
- |
  kind: KubeletConfiguration
  failCgroupV1: false
"""


def docker_cli() -> str:
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    found = subprocess.run(
        [str(HACK / "images.sh"), "cli"], text=True, capture_output=True, check=False
    )
    if found.returncode != 0 or not found.stdout.strip():
        raise NodeImageError(
            f"no docker CLI that builds with BuildKit: {found.stderr.strip()}\n"
            "Fix: hack/images.sh engine"
        )
    return found.stdout.strip()


def _run(cmd: Sequence[str], *, stdin: int | None = None, quiet: bool = False) -> str:
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    proc = subprocess.run(
        list(cmd),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise NodeImageError(
            f"`{' '.join(cmd[:6])}…` failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
        )
    if not quiet and proc.stdout.strip():
        for line in proc.stdout.strip().splitlines()[-3:]:
            log(f"  {line}")
    return proc.stdout


def _binaries() -> dict[str, Path]:
    wanted = {
        "kubernetes": ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
        "kubernetes-node": ("kubelet", "kubeadm", "kube-proxy"),
        "etcd": ("etcd",),
        "coredns": ("coredns",),
        "containerd": ("containerd", "ctr", "containerd-shim-runc-v2"),
        "runc": ("runc",),
        "cri-tools": ("crictl",),
    }
    gobuild.build([*wanted, "cni-plugins", "kind"])
    paths = {name: gobuild.bin_path(name) for names in wanted.values() for name in names}
    return paths


def _pause(out: Path) -> Path:
    """The sandbox process, from the Kubernetes module's own source (static: FROM scratch-like)."""
    source = (
        gobuild.module_dir("k8s.io/kubernetes", kubernetes_version()) / "build/pause/linux/pause.c"
    )
    if not source.exists():
        raise NodeImageError(
            f"{source} is missing. Fix: hack/cluster.sh build (downloads the module)"
        )
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise NodeImageError("no C compiler for pause.c. Fix: apt-get install -y gcc libc6-dev")
    binary = out / "pause"
    _run(
        [
            cc,
            "-Os",
            "-static",
            "-Wall",
            "-Werror",
            "-DVERSION=local",
            "-o",
            str(binary),
            str(source),
        ]
    )
    return binary


def _pause_image(kubeadm: Path) -> str:
    listed = _run(
        [str(kubeadm), "config", "images", "list", "--kubernetes-version", kubernetes_version()],
        quiet=True,
    ).split()
    for image in listed:
        if "/pause:" in image:
            return image
    raise NodeImageError(f"kubeadm lists no pause image: {listed}")


def _inputs_digest(binaries: dict[str, Path], kind_files: Path) -> str:
    digest = hashlib.sha256()
    for tool in gobuild.TOOLS:
        if tool.name in {
            "kubernetes",
            "kubernetes-node",
            "etcd",
            "coredns",
            "containerd",
            "runc",
            "cri-tools",
            "cni-plugins",
            "kind",
        }:
            digest.update(f"{tool.name}={tool.stamp()}".encode())
    for root in (KIND_DIR, kind_files):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update(" ".join(sorted(binaries)).encode())
    return digest.hexdigest()[:20]


def _current_digest(docker: str, image: str) -> str:
    proc = subprocess.run(
        [docker, "image", "inspect", "-f", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _stage(context: Path, binaries: dict[str, Path], kind_files: Path, pause: Path) -> None:
    shutil.copytree(kind_files, context / "kind-files")
    (context / "bin").mkdir()
    for name in (
        "containerd",
        "ctr",
        "containerd-shim-runc-v2",
        "crictl",
        "runc",
        "kubelet",
        "kubeadm",
        "kubectl",
    ):
        shutil.copy2(binaries[name], context / "bin" / name)
    shutil.copytree(
        gobuild.tool("cni-plugins").bin_dir(),
        context / "cni",
        ignore=shutil.ignore_patterns(".stamp"),
    )
    shutil.copytree(KIND_DIR / "node", context / "overlay")
    (context / "overlay" / "kind" / "version").write_text(kubernetes_version())
    components_dir = context / "components"
    components_dir.mkdir()
    for binary in (b for b in binaries if b.startswith("kube-") or b in {"etcd", "coredns"}):
        shutil.copy2(binaries[binary], components_dir / binary)
    shutil.copy2(pause, components_dir / "pause")


@contextlib.contextmanager
def _build_container(docker: str, image: str) -> Iterator[str]:
    cid = _run(
        [
            docker,
            "run",
            "-d",
            "--privileged",
            "--security-opt",
            "seccomp=unconfined",
            "--entrypoint=sleep",
            image,
            "infinity",
        ],
        quiet=True,
    ).strip()
    try:
        yield cid
    finally:
        subprocess.run([docker, "rm", "-f", "-v", cid], capture_output=True, check=False)


def _in_container(docker: str, cid: str, script: str, quiet: bool = True) -> str:
    """A bash script run inside the build container."""
    return _run([docker, "exec", cid, "bash", "-c", script], quiet=quiet)


def _preload(docker: str, cid: str, images: Sequence[str]) -> None:
    """Import the images into the node's containerd without unpacking, as kind does."""
    _in_container(docker, cid, "nohup containerd >/var/log/containerd-build.log 2>&1 &")
    _in_container(
        docker,
        cid,
        "for i in $(seq 60); do [ -S /run/containerd/containerd.sock ] "
        "&& ctr version >/dev/null && exit 0; sleep 0.5; done; "
        "cat /var/log/containerd-build.log; exit 1",
    )
    for image in images:
        log(f"preloading {image}")
        save = subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE)
        assert save.stdout is not None
        try:
            _run(
                [
                    docker,
                    "exec",
                    "-i",
                    cid,
                    "ctr",
                    "--namespace=k8s.io",
                    "images",
                    "import",
                    "--label=io.cri-containerd.pinned=pinned",
                    "--all-platforms",
                    "--no-unpack",
                    "--digests",
                    "-",
                ],
                stdin=save.stdout.fileno(),
                quiet=True,
            )
        finally:
            save.stdout.close()
            if save.wait() != 0:
                raise NodeImageError(f"docker save {image} failed")
    listed = _run(
        [docker, "exec", cid, "ctr", "--namespace=k8s.io", "images", "list", "-q"], quiet=True
    )
    missing = [i for i in images if i not in listed.split()]
    if missing:
        raise NodeImageError(f"not in the node's containerd after import: {missing}\n{listed}")
    # containerd is the build container's own process (its pid namespace). Its parent
    # there is `sleep`, which reaps nothing: done when only a zombie is left.
    _in_container(
        docker,
        cid,
        "kill $(pgrep -x containerd); for i in $(seq 40); do "
        "ps -C containerd -o stat= | grep -qv '^Z' || exit 0; sleep 0.25; done; exit 1",
    )


def build(force: bool = False) -> str:
    """Build (or find up to date) the node image; its name."""
    start = time.monotonic()
    docker = docker_cli()
    binaries = _binaries()
    kind_files = gobuild.module_dir("sigs.k8s.io/kind", kind_version()) / "images/base/files"
    if not kind_files.is_dir():
        raise NodeImageError(f"{kind_files} is missing. Fix: hack/cluster.sh build kind")
    name = image_name()
    digest = _inputs_digest(binaries, kind_files)
    if not force and _current_digest(docker, name) == digest:
        log(f"{name}: up to date (inputs {digest})")
        return name
    with _build_lock():
        # Built meanwhile by the build this one waited for (hack/warm-up.sh's)?
        if not force and _current_digest(docker, name) == digest:
            log(f"{name}: built meanwhile (inputs {digest})")
            return name
        _build(docker, name, digest, binaries, kind_files)
    log(f"{name}: built in {time.monotonic() - start:.0f}s (inputs {digest})")
    return name


# Docker's cgroup, idle while hack/warm-up.sh builds (its builds' containers run there).
DOCKER_IDLE: Final = Path("/sys/fs/cgroup/cpu/docker/cpu.idle")


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build of the node image at a time, machine-wide: the kind test waits for the
    warm-up's build instead of building a second one beside it. A build waited for gets
    a normal share of the CPU from then on (the warm-up's cgroup and Docker's), as
    hack/images.sh does for the images: the test would otherwise wait on a build that
    gets no CPU while both test streams run."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "kind-node-image.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("waiting for another build of the node image (hack/warm-up.sh's?)")
            for knob in (gobuild.WARM_UP_IDLE, DOCKER_IDLE):
                if gobuild.set_idle(knob, False):
                    log(f"raised {knob.parent} to normal CPU priority while it is waited for")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(
    docker: str, name: str, digest: str, binaries: dict[str, Path], kind_files: Path
) -> None:
    pause_image = _pause_image(binaries["kubeadm"])
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kind-node-", dir=CACHE) as tmp:
        context = Path(tmp)
        pause = _pause(context)
        _stage(context, binaries, kind_files, pause)
        wanted = components(pause_image)
        for component in wanted:
            log(f"image {component.image}")
            _run(
                [
                    docker,
                    "build",
                    "-f",
                    str(KIND_DIR / "component.Dockerfile"),
                    "--build-arg",
                    f"BINARY={component.binary}",
                    "--build-arg",
                    f"PACKAGES={component.packages}",
                    "-t",
                    component.image,
                    str(context / "components"),
                ],
                quiet=True,
            )
        base = f"{REPOSITORY}-base:{kubernetes_version()}"
        log(f"node base {base} (Debian packages, kind's files, the node binaries)")
        _run(
            [
                docker,
                "build",
                "-f",
                str(KIND_DIR / "node.Dockerfile"),
                "--build-arg",
                f"SANDBOX_IMAGE={pause_image}",
                "-t",
                base,
                str(context),
            ]
        )
    with _build_container(docker, base) as cid:
        _preload(docker, cid, [c.image for c in wanted])
        _run(
            [
                docker,
                "commit",
                "--change",
                'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
                "--change",
                "CMD []",
                "--change",
                f"LABEL {INPUTS_LABEL}={digest}",
                cid,
                name,
            ],
            quiet=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="hack/kind.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["node-image", "config", "image-name", "kind", "path"],
        help="node-image: build it, print its name; config: the kind config for it; "
        "image-name: its name; kind: the path of kind, built; path: the directories of "
        "kind, kubectl and helm, built, as a PATH prefix",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    try:
        if args.command == "node-image":
            print(build(force=args.force))
        elif args.command == "config":
            print(config(), end="")
        elif args.command == "image-name":
            print(image_name())
        elif args.command == "kind":
            print(gobuild.ensure("kind"))
        else:
            print(":".join(str(gobuild.ensure(b).parent) for b in ("kind", "kubectl", "helm")))
    except (NodeImageError, gobuild.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
