"""What a pod's runner needs from the agent that hosts it, and nothing more.

pod.PodRunner depends on this protocol, not on agent.Agent (which implements
it), so the agent imports the runner and never the other way round.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from .gpus import GpuPool
from .kube import Kube
from .netns import Network


class PodHost(Protocol):
    kube: Kube
    # The pod namespaces and their addresses; its gateway is the pods' DNS server.
    network: Network
    gpus: GpuPool
    pods_dir: Path  # <pods_dir>/<uid>: a pod's volumes, /etc files and info.json
    logs_dir: Path  # <logs_dir>/<ns>_<pod>_<uid>/<container>.log: kept after the agent stops
    stopping: threading.Event  # set when the agent shuts down: every pod stops at once
    path: str  # every container's PATH (the path prefix standing in for the image first)
    # Every container's PYTHONPATH ("" for none): the checkout's worker packages, as
    # the image has them (the venv's own install may be another checkout's).
    python_path: str
    # Host paths every pod must see (the agent's state, the image's stand-in programs):
    # a pod-private directory that would hide one is not made private.
    shared_paths: list[Path]
    allocatable: dict[str, str]  # the node's allocatable (resourceFieldRef falls back to it)
    host_has_gpus: bool  # whether CUDA_VISIBLE_DEVICES names real devices

    def ensure_mountpoint(self, path: Path, is_dir: bool) -> None:
        """Create a missing mount point on the host (removed when the agent stops)."""
        ...
