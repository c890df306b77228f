"""The nvidia.com/gpu devices of the agent's nodes: which are free, which a pod holds."""

from __future__ import annotations

import threading
from typing import Any

GPU = "nvidia.com/gpu"


def requested(pod: dict[str, Any]) -> int:
    """How many GPUs the pod's containers ask for (their limits, summed)."""
    wanted = 0
    for c in pod["spec"]["containers"]:
        limits = (c.get("resources") or {}).get("limits") or {}
        wanted += int(str(limits.get(GPU, 0)))
    return wanted


class GpuPool:
    """Device numbers 0..per_node-1 on every node, handed to pods and given back."""

    def __init__(self, nodes: list[str], per_node: int):
        self._lock = threading.Lock()
        self._free = {n: list(range(per_node)) for n in nodes}

    def take(self, node: str, pod: dict[str, Any]) -> list[int]:
        """The devices for `pod` on `node` (fewer when not enough are free)."""
        wanted = requested(pod)
        with self._lock:
            free = self._free[node]
            taken, self._free[node] = free[:wanted], free[wanted:]
        return taken

    def give_back(self, node: str, gpus: list[int]) -> None:
        with self._lock:
            self._free[node] = sorted(self._free[node] + gpus)
