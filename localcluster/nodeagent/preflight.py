"""Checks the agent runs before it registers a node: stop at start, never mid-job."""

from __future__ import annotations

import os
import shutil
import subprocess

from .netns import sandbox_command


class PreflightError(RuntimeError):
    """Names the cause and the fix."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)), None
    )


def check(prefix: str) -> None:
    missing = [
        (tool, package)
        for tool, package in (
            ("ip", "iproute2"),
            ("unshare", "util-linux"),
            ("nsenter", "util-linux"),
            ("sshd", "openssh-server"),
            ("ssh", "openssh-client"),
        )
        if _which(tool) is None
    ]
    if missing:
        tools = ", ".join(t for t, _ in missing)
        packages = " ".join(sorted({p for _, p in missing}))
        raise PreflightError(
            f"{tools} not found: the agent needs iproute2 for pod networks, util-linux for "
            f"namespaces and sshd/ssh for Horovod's launcher. Fix: apt-get install -y {packages}"
        )
    if os.geteuid() != 0:
        raise PreflightError(
            "the node agent must run as root: it creates network namespaces, veth pairs and "
            "mounts. Fix: run it with sudo (or as root in a container started with "
            "--privileged or --cap-add SYS_ADMIN --cap-add NET_ADMIN)."
        )
    probe = f"{prefix}-preflight"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    steps = [
        ["ip", "netns", "add", probe],
        ["ip", "-n", probe, "link", "add", "br-probe", "type", "bridge"],
        ["ip", "-n", probe, "link", "add", "vp-probe", "type", "veth", "peer", "name", "vq-probe"],
        sandbox_command(probe, "hostname", "preflight"),
    ]
    try:
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True)
            if proc.returncode != 0:
                raise PreflightError(
                    f"`{' '.join(step)}` failed: {proc.stderr.strip() or proc.returncode}. The "
                    "agent needs CAP_SYS_ADMIN and CAP_NET_ADMIN to create network, UTS and "
                    "mount namespaces, bridges and veth pairs. Fix: run it as root on the host, "
                    "or in a container started with --privileged."
                )
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
