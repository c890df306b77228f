"""Run under horovodrun: CpuSyncBatchNorm on each rank's part of a batch against
nn.BatchNorm1d on the whole batch (outputs, running statistics, gradients).
Rank 0 prints the largest differences as an HVJOB_RESULT line."""

import horovod.torch as hvd
import torch
from torch import nn

import horovod_contract as contract
from horovod_worker.torch_layers import CpuSyncBatchNorm


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    full = torch.randn(6 * size, 5, dtype=torch.float64) * 3 + 1
    weights = torch.randn(6 * size, 5, dtype=torch.float64)  # a loss that is not symmetric
    mine = full.chunk(size)[rank].clone().requires_grad_()
    whole = full.clone().requires_grad_()

    synced = CpuSyncBatchNorm(5, sync_name="check").double()
    reference = nn.BatchNorm1d(5).double()
    out = synced(mine)
    (out * weights.chunk(size)[rank]).sum().backward()
    ref_out = reference(whole)
    (ref_out * weights).sum().backward()

    assert synced.weight.grad is not None and reference.weight.grad is not None
    assert mine.grad is not None and whole.grad is not None
    stats = (synced.running_mean, synced.running_var, reference.running_mean, reference.running_var)
    mean, var, ref_mean, ref_var = stats
    assert mean is not None and var is not None and ref_mean is not None and ref_var is not None
    # The affine parameters' gradients are per-rank sums (the optimizer averages them).
    weight_grad = hvd.allreduce(synced.weight.grad, op=hvd.Sum, name="check.wgrad")
    errors = {
        "output": float((out - ref_out.chunk(size)[rank]).abs().max()),
        "running_mean": float((mean - ref_mean).abs().max()),
        "running_var": float((var - ref_var).abs().max()),
        "input_grad": float((mine.grad - whole.grad.chunk(size)[rank]).abs().max()),
        "weight_grad": float((weight_grad - reference.weight.grad).abs().max()),
    }
    gathered = hvd.allgather_object(errors, name="check.errors")
    if rank == 0:
        worst = {key: max(e[key] for e in gathered) for key in errors}
        print(contract.result_line({"size": size, "max_errors": worst}), flush=True)


if __name__ == "__main__":
    main()
