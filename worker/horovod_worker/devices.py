"""Which device a Horovod process trains on.

Every process on a host is pinned to one GPU by ``hvd.local_rank()``: process
``i`` on a host takes the ``i``-th GPU visible to it. The decision is a pure
function of the visible devices so that it is tested without GPUs; the
trainers list the devices with their framework and apply the choice.
"""

from collections.abc import Sequence
from dataclasses import dataclass


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
) -> DeviceChoice:
    """Pin process ``local_rank`` of ``local_size`` on this host to a device.

    ``visible_gpus`` are the names of the GPUs the framework sees (already
    filtered by CUDA_VISIBLE_DEVICES, which the device plugin sets per pod);
    ``cuda_visible_devices`` only makes the messages precise.

    No visible GPU means CPU training (the choice says why, for the log). Fewer
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
