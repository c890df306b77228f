"""Set up one container's namespaces from inside them, then exec its command.

The agent starts every container as

    ip netns exec <pod netns> unshare --uts --mount --propagation private -- \\
        python podinit.py <spec.json>

so this runs already inside the pod's network namespace and in a fresh UTS and
mount namespace. It sets the hostname, bind-mounts the pod's volumes (and its
/etc/hosts, /etc/resolv.conf and /etc/hostname) where the container expects
them, and replaces itself with the container's command: the process the agent
waits on is the container's main process. Standard library only.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, flags: int) -> None:
    if _libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def bind(source: str, target: str, read_only: bool) -> None:
    _mount(source, target, MS_BIND | MS_REC)
    if read_only:
        _mount(source, target, MS_BIND | MS_REMOUNT | MS_RDONLY)


PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_LAST = 63  # prctl refuses numbers past the kernel's last capability (EINVAL)


def _prctl(option: int, arg: int) -> int:
    return int(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0))


def become(user: dict[str, Any] | None) -> None:
    """Drop to the container's user (securityContext): capabilities, groups, uid."""
    if not user:
        return
    if user["drop_all_capabilities"]:
        for cap in range(CAP_LAST + 1):
            _prctl(PR_CAPBSET_DROP, cap)
    if user["uid"] != 0 or user["gid"] != 0 or user["groups"]:
        os.setgroups(user["groups"])
        os.setgid(user["gid"])
        os.setuid(user["uid"])  # a non-root uid loses every capability it had
    if user["no_new_privs"] and _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def tmpfs(target: str, mode: int) -> None:
    options = f"mode={mode:o}".encode()
    flags = MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        socket.sethostname(spec["hostname"])
        # Hold every source first: a later mount (the private /tmp) may hide its path.
        sources = [
            os.open(m["source"], os.O_PATH | os.O_CLOEXEC) if "source" in m else -1
            for m in spec["mounts"]
        ]
        for m, fd in zip(spec["mounts"], sources, strict=True):
            if m.get("tmpfs"):
                tmpfs(m["target"], m["mode"])
                continue
            if not os.path.lexists(m["target"]):
                # Only under the pod's private ~/.ssh or /tmp: the agent made the others.
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(m["target"])
                else:
                    os.makedirs(os.path.dirname(m["target"]), exist_ok=True)
                    open(m["target"], "a").close()
            bind(f"/proc/self/fd/{fd}", m["target"], m.get("readOnly", False))
        os.chdir(spec.get("workingDir") or "/")
        become(spec.get("user"))
    except OSError as exc:
        print(f"nodeagent: setting up the container failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(128)
    argv, env = spec["argv"], spec["env"]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"nodeagent: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
