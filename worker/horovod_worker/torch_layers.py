"""PyTorch pieces of --amp and --sync-batchnorm that Horovod does not provide itself.

hvd.SyncBatchNorm computes its statistics with CUDA-only kernels
(torch.batch_norm_stats and friends) and refuses CPU tensors, so CPU ranks get
``CpuSyncBatchNorm``: the same statistics (sum and sum of squares allreduced
over all ranks) in plain tensor operations, with a named allreduce in the
backward pass too. GPU ranks use hvd.SyncBatchNorm unchanged.
"""

from typing import Any

import horovod.torch as hvd
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from horovod_worker.common import checksum


class _SumOverRanks(torch.autograd.Function):
    """Allreduce-sum whose gradient is the allreduce-sum of the gradients, both
    named: Horovod matches collectives by name, and an unnamed one in a backward
    pass gets a per-process counter name that other collectives can shift."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str) -> torch.Tensor:
        ctx.name = name
        summed: torch.Tensor = hvd.allreduce(tensor, op=hvd.Sum, name=name)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return hvd.allreduce(grad.contiguous(), op=hvd.Sum, name=f"{ctx.name}.grad"), None


class CpuSyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch, for CPU tensors (any N-D input
    with channels in dimension 1, like hvd.SyncBatchNorm)."""

    def __init__(self, *args: Any, sync_name: str = "sync_bn", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sync_name = sync_name

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or hvd.size() == 1:
            return super().forward(input)
        # Statistics in float32 at least (under autocast the input is 16-bit).
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        dims = [0, *range(2, x.dim())]
        local = torch.cat(
            [x.sum(dims), (x * x).sum(dims), x.new_tensor([float(x.numel() // x.size(1))])]
        )
        total: torch.Tensor = _SumOverRanks.apply(local, self.sync_name)  # type: ignore[no-untyped-call]
        channels = x.size(1)
        count = total[-1]
        mean = total[:channels] / count
        var = (total[channels : 2 * channels] / count - mean * mean).clamp_min(0.0)
        if self.track_running_stats and self.running_mean is not None:
            assert self.running_var is not None and self.num_batches_tracked is not None
            momentum = 0.1 if self.momentum is None else self.momentum
            with torch.no_grad():
                unbiased = var * count / (count - 1).clamp_min(1.0)
                self.running_mean.mul_(1 - momentum).add_(momentum * mean)
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased)
                self.num_batches_tracked.add_(1)
        shape = [1, channels, *([1] * (x.dim() - 2))]
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        out: torch.Tensor = y.to(input.dtype)
        return out


def convert_sync_batchnorm(module: nn.Module, on_gpu: bool, prefix: str = "bn") -> nn.Module:
    """Replace every BatchNorm layer with its synchronized form, keeping its state
    (what torch.nn.SyncBatchNorm.convert_sync_batchnorm does for torch.distributed)."""
    if isinstance(module, _BatchNorm) and not isinstance(
        module, hvd.SyncBatchNorm | CpuSyncBatchNorm
    ):
        options = {
            "eps": module.eps,
            "momentum": module.momentum,
            "affine": module.affine,
            "track_running_stats": module.track_running_stats,
        }
        synced: nn.Module = (
            hvd.SyncBatchNorm(module.num_features, **options)
            if on_gpu
            else CpuSyncBatchNorm(module.num_features, sync_name=prefix, **options)
        )
        synced.load_state_dict(module.state_dict())
        return synced
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, on_gpu, f"{prefix}.{name}"))
    return module


def batchnorm_checksum(model: nn.Module) -> str | None:
    """Checksum of every batch-norm layer's running mean and variance; None without any."""
    stats = [
        tensor.detach().cpu().numpy()
        for layer in model.modules()
        if isinstance(layer, _BatchNorm)
        for tensor in (layer.running_mean, layer.running_var)
        if tensor is not None
    ]
    return checksum(stats) if stats else None


def amp_dtype(requested: str, on_gpu: bool) -> torch.dtype:
    """The autocast type: float16 on GPUs and bfloat16 on CPUs unless asked otherwise.

    CPUs run float16 matmuls slowly or not at all, and bfloat16 keeps float32's
    exponent range, so it needs no loss scaling.
    """
    if requested == "float16":
        return torch.float16
    if requested == "bfloat16":
        return torch.bfloat16
    return torch.float16 if on_gpu else torch.bfloat16
