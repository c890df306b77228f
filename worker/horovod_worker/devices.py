"""Which device a Horovod process trains on.

Every process on a host is pinned to one GPU by ``hvd.local_rank()``: process
``i`` on a host takes the ``i``-th GPU visible to it. The decision is a pure
function of the visible devices so that it is tested without GPUs; the
trainers list the devices with their framework and apply the choice.
"""

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import horovod_contract as contract


class DeviceError(RuntimeError):
    """The host cannot give every local process a GPU of its own."""


@dataclass(frozen=True)
class DeviceChoice:
    """A GPU index among the visible ones, or the CPU (``gpu_index`` None)."""

    gpu_index: int | None
    name: str
    reason: str

    @property
    def is_gpu(self) -> bool:
        return self.gpu_index is not None

    def describe(self) -> str:
        """One short label for logs: ``gpu:1 (NVIDIA H100)`` or ``cpu``."""
        if self.gpu_index is None:
            return "cpu"
        return f"gpu:{self.gpu_index} ({self.name})" if self.name else f"gpu:{self.gpu_index}"


def select_device(
    local_rank: int,
    local_size: int,
    visible_gpus: Sequence[str],
    cuda_visible_devices: str | None = None,
    gpus_requested: int | None = None,
    allow_cpu: bool = False,
) -> DeviceChoice:
    """Pin process ``local_rank`` of ``local_size`` on this host to a device.

    ``visible_gpus`` are the names of the GPUs the framework sees (already
    filtered by CUDA_VISIBLE_DEVICES, which the device plugin sets per pod);
    ``cuda_visible_devices`` only makes the messages precise.

    ``gpus_requested`` is what the pod asked for (the operator's
    HVJOB_GPUS_PER_WORKER): asked for GPUs and seeing none is an error, not CPU
    training, unless ``allow_cpu``. Otherwise no visible GPU means CPU training
    (the choice says why, for the log). Fewer
    GPUs than local processes is an error rather than two processes sharing a
    GPU: that either runs out of memory or silently halves throughput, and the
    cause (slotsPerWorker above the GPUs per pod) is a configuration mistake.
    """
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise ValueError(f"local_rank {local_rank} is not within local_size {local_size}")
    env_note = (
        f" (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r})"
        if cuda_visible_devices is not None
        else ""
    )
    if not visible_gpus:
        if gpus_requested and not allow_cpu:
            raise DeviceError(
                f"the pod asked for {gpus_requested} GPU(s) (nvidia.com/gpu) but none is "
                f"visible{env_note}: check the node's NVIDIA device plugin and container "
                "runtime (runtimeClassName), or pass --allow-cpu to train on the CPU anyway"
            )
        return DeviceChoice(None, "", f"no GPU visible{env_note}: training on the CPU")
    if local_size > len(visible_gpus):
        raise DeviceError(
            f"{local_size} Horovod processes on this host but only {len(visible_gpus)} "
            f"GPU(s) visible{env_note}: each process needs its own GPU; start at most "
            f"{len(visible_gpus)} process(es) per host (slotsPerWorker) or give each "
            f"worker {local_size} GPUs (nvidia.com/gpu)"
        )
    return DeviceChoice(
        local_rank,
        visible_gpus[local_rank],
        f"local_rank {local_rank} of {local_size} takes GPU {local_rank} "
        f"of {len(visible_gpus)}{env_note}",
    )


def select_for_pod(
    local_rank: int,
    local_size: int,
    visible_gpus: Sequence[str],
    allow_cpu: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> DeviceChoice:
    """select_device with what the pod says about itself: the GPUs it asked for
    (the operator's environment) and whether CPU training is expected anyway."""
    raw = environ.get(contract.ENV_GPUS_PER_WORKER, "")
    requested = int(raw) if raw.isdigit() else None
    return select_device(
        local_rank,
        local_size,
        visible_gpus,
        environ.get("CUDA_VISIBLE_DEVICES"),
        gpus_requested=requested,
        allow_cpu=allow_cpu or environ.get(contract.ENV_ALLOW_CPU) == "1",
    )


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs this container may use by its cgroup quota (a pod's CPU limit), or
    None without one: cgroup v2's cpu.max, else v1's cfs quota and period."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


def default_threads(
    local_size: int, cpu_limit: float | None = None, cores: int | None = None
) -> int:
    """CPU threads per process: the cores this container may use (its affinity, and
    its CPU limit when it has one: more threads than the quota only get throttled)
    shared by the processes on this host."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    usable = float(cores or 1)
    if cpu_limit is not None:
        usable = min(usable, max(1.0, math.ceil(cpu_limit)))
    return max(1, int(usable) // max(1, local_size))
