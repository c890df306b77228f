"""What each container sees mounted: the pod's /etc files, private ~/.ssh and /tmp, its volumes.

podinit.py bind-mounts this list inside the container's mount namespace; the
mount points themselves must exist on the host (the agent makes missing ones).
"""

from __future__ import annotations

from pathlib import Path

from . import spec
from .podhost import PodHost
from .spec import HOME, Obj

SHELL_RC_FILES = (f"{HOME}/.bashrc", f"{HOME}/.profile", f"{HOME}/.bash_profile")
# Directories that are private to each pod: (name under the pod's dir, path, mode).
PRIVATE_DIRS = (("ssh", f"{HOME}/.ssh", 0o700), ("tmp", "/tmp", 0o1777))
ETC_FILES = ("hosts", "resolv.conf", "hostname")


def write_etc(pod_dir: Path, pod: Obj, pod_ip: str, nameserver: str) -> None:
    """The pod's /etc/hosts, /etc/resolv.conf and /etc/hostname, shared by its containers."""
    etc = pod_dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(spec.hosts_file(pod, pod_ip))
    (etc / "resolv.conf").write_text(spec.resolv_conf(pod["metadata"]["namespace"], nameserver))
    (etc / "hostname").write_text(spec.pod_hostname(pod) + "\n")


def reachable_mounts(paths: list[Path], uid: int) -> list[Obj]:
    """What a non-root container needs to reach `paths` (the programs standing in
    for the image, e.g. a Python under /root/.pyenv behind a 0700 /root): a tmpfs
    over each directory on the way that `uid` cannot traverse, with the part of the
    path below it bound back. The container sees nothing else there, as a
    container would not; the host's directories keep their modes.
    """
    if uid == 0:
        return []
    hidden: list[Obj] = []
    bound: list[Obj] = []
    for path in paths:
        for parent in reversed(path.parents):
            if _traversable(parent, uid):
                continue
            child = Path(*path.parts[: len(parent.parts) + 1])
            if not any(m["target"] == str(parent) for m in hidden):
                hidden.append({"tmpfs": True, "target": str(parent), "mode": 0o755})
            if not any(m["target"] == str(child) for m in bound):
                bound.append({"source": str(child), "target": str(child), "readOnly": True})
            break
    return hidden + bound


def _traversable(directory: Path, uid: int) -> bool:
    try:
        st = directory.stat()
    except OSError:
        return True  # nothing there to hide
    return bool(st.st_mode & 0o001) or (st.st_uid == uid and bool(st.st_mode & 0o100))


def container_mounts(pod_dir: Path, pod: Obj, container: Obj, host: PodHost) -> list[Obj]:
    """The mounts of one container: {"source", "target", "readOnly"}, in mount order."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    etc = pod_dir / "etc"
    mounts = [
        {"source": str(etc / name), "target": f"/etc/{name}", "readOnly": False}
        for name in ETC_FILES
    ]
    # A container has a file system of its own; here the host's stands in, so at
    # least ~/.ssh and /tmp are the pod's own: sshd's keys and configs, ssh's
    # known_hosts and temporary files never touch the host's or another pod's.
    # (Not all of HOME: the host's Python may live there, e.g. ~/.pyenv.)
    for name, target, mode in PRIVATE_DIRS:
        if any(path.is_relative_to(target) for path in host.shared_paths):
            # e.g. a checkout under /tmp: a private /tmp would hide the venv.
            continue
        private = pod_dir / name
        private.mkdir(exist_ok=True)
        private.chmod(mode)
        if target != "/tmp":
            host.ensure_mountpoint(Path(target), is_dir=True)
        mounts.append({"source": str(private), "target": target, "readOnly": False})
    # The host's shell start-up files are not the image's: one that puts another
    # Python first on PATH (pyenv shims) would break every rank started over ssh.
    for rc in SHELL_RC_FILES:
        if Path(rc).exists():
            blank = etc / "shell-rc"
            blank.write_text("# the node agent hides the host's shell start-up files\n")
            mounts.append({"source": str(blank), "target": rc, "readOnly": True})
    message_file = pod_dir / f"{container['name']}.termination-log"
    message_file.touch()
    message_file.chmod(0o666)  # as the kubelet makes it: any container user writes it
    message_path = container.get("terminationMessagePath") or "/dev/termination-log"
    host.ensure_mountpoint(Path(message_path), is_dir=False)
    mounts.append({"source": str(message_file), "target": message_path, "readOnly": False})
    for m in container.get("volumeMounts") or []:
        volume = volumes[m["name"]]
        if "hostPath" in volume:
            source = Path(volume["hostPath"]["path"])
        else:
            source = pod_dir / "volumes" / m["name"]
        if m.get("subPath"):
            source = source / m["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        target = m["mountPath"]
        if not any(target.startswith(f"{p}/") for _, p, _ in PRIVATE_DIRS):
            # Under the private directories podinit makes the mount point itself.
            host.ensure_mountpoint(Path(target), is_dir=source.is_dir())
        mounts.append(
            {"source": str(source), "target": target, "readOnly": bool(m.get("readOnly"))}
        )
    return mounts
