"""What both trainers share: run settings, checks, metrics and output lines.

Nothing here imports a framework. Horovod is passed in as ``hvd`` (the
``horovod.torch`` or ``horovod.tensorflow`` module: both offer the same
``rank``/``size``/``allgather_object``/``broadcast_object`` surface).
"""

import hashlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import horovod_contract as contract
from horovod_contract.rank_output import split_by_rank


class WorkerError(RuntimeError):
    """A problem the user can fix; printed as one line, exit status 1."""


@dataclass(frozen=True)
class TrainConfig:
    """The command line, validated (see train.py for the meaning of each field)."""

    framework: str
    mode: str
    dataset: str
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    warmup_epochs: float
    hidden: int
    seed: int
    checkpoint_dir: Path | None
    log_dir: Path | None
    data_dir: Path | None
    resume: bool
    synthetic_samples: int
    threads: int | None
    allow_cpu: bool = False
    image_size: int = 32
    # Horovod's performance options (docs/worker.md).
    fp16_allreduce: bool = False
    adasum: bool = False
    backward_passes_per_step: int = 1
    gradient_predivide_factor: float = 1.0
    # Mixed precision and batch normalization (docs/worker.md).
    amp: bool = False
    amp_dtype: str = "auto"  # auto: float16 on GPUs, bfloat16 on CPUs
    clip_grad_norm: float | None = None
    batchnorm: bool = False
    sync_batchnorm: bool = False


def emit(line: str) -> None:
    """One line to stdout in one write. The images set PYTHONUNBUFFERED, under which
    print() writes a line and its newline apart, and mpirun's tagged output let
    another rank's line begin in between (kind CI of 2026-12-06: rank 1's start
    line and rank 0's on one line, and the operator missed rank 0's)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def log(rank: int, message: str) -> None:
    emit(f"[horovod_worker rank {rank}] {message}")


def check_expected_size(size: int, environ: Mapping[str, str] = os.environ) -> None:
    """Fail when Horovod's world is not the one the launcher started.

    A Horovod built with MPI but launched for Gloo without HOROVOD_CONTROLLER=gloo
    starts every process as its own world of size 1; they all "succeed" alone.
    """
    raw = environ.get(contract.ENV_EXPECTED_SIZE)
    if raw is None or raw.strip() == "":
        return
    try:
        expected = int(raw)
    except ValueError:
        raise WorkerError(f"{contract.ENV_EXPECTED_SIZE}={raw!r} is not an integer") from None
    if expected != size:
        hint = ""
        if size == 1:
            hint = (
                "; every process is alone: with --gloo (or a Horovod built with MPI run "
                "under Gloo) set HOROVOD_CONTROLLER=gloo and HOROVOD_CPU_OPERATIONS=gloo, "
                "or start the ranks with horovodrun/mpirun"
            )
        raise WorkerError(
            f"hvd.size() is {size} but {contract.ENV_EXPECTED_SIZE}={expected}: "
            f"the ranks did not join one Horovod world{hint}"
        )


def agree_on_error(hvd: Any, error: str | None) -> None:
    """Collective: raise on every rank when any rank had an error.

    Every rank must call it, errors or not, so that a problem seen by one rank
    (a missing file on its host, an unwritable directory on rank 0) stops all
    ranks with the same message instead of leaving the others blocked in the
    next collective.
    """
    # An explicit name: Horovod matches collectives across ranks by name, and
    # the default one is the object's type (str here, NoneType there): a hang.
    errors = hvd.allgather_object(error, name="agree_on_error")
    for rank, message in enumerate(errors):
        if message is not None:
            prefix = "" if hvd.size() == 1 else f"rank {rank}: "
            raise WorkerError(f"{prefix}{message}")


def ensure_writable_dir(path: Path, what: str) -> None:
    """Create ``path`` if needed and prove a file can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise WorkerError(f"{what} {path} is not writable: {reason}") from None


# Horovod implements Adasum on MPI only; under the Gloo controller it fails mid-step.
ADASUM_NEEDS_MPI = (
    "--adasum needs Horovod's MPI controller (horovodrun --mpi; launchMode: mpi with Open "
    "MPI): the Gloo controller has no Adasum"
)


def lr_scale(size: int, local_size: int, adasum: bool, on_gpu: bool) -> int:
    """How many times --lr the warmed-up rate is. Averaging gradients over `size`
    ranks makes the step `size` times smaller than the global batch calls for, so
    the rate grows by `size`; Adasum combines gradients without that shrinkage, so
    it needs none on CPUs and `local_size` on GPUs (where it averages within a node
    first) -- Horovod's documented rule."""
    if adasum:
        return local_size if on_gpu else 1
    return size


def learning_rate(
    step: int, steps_per_epoch: int, base_lr: float, size: int, warmup_epochs: float
) -> float:
    """Linear scaling with warm-up (Goyal et al., 2017).

    The target rate is ``base_lr * size`` (the global batch is ``size`` times
    larger); it ramps linearly from ``base_lr`` over ``warmup_epochs`` so that
    early steps with a large rate do not diverge. It depends on the global step
    only, so a resumed run follows the same schedule as an uninterrupted one.
    """
    target = base_lr * size
    warmup_steps = warmup_epochs * steps_per_epoch
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * step / warmup_steps


def order_fingerprint(indices: Iterable[int]) -> str:
    """A short digest of the order samples are visited in."""
    return hashlib.sha256(np.asarray(list(indices), dtype=np.int64).tobytes()).hexdigest()[:12]


def checksum(arrays: Iterable[np.ndarray]) -> str:
    """SHA-256 of the exact bytes of the given arrays (parameters, in order)."""
    digest = hashlib.sha256()
    for array in arrays:
        contiguous = np.ascontiguousarray(array)
        digest.update(str(contiguous.dtype).encode())
        digest.update(str(contiguous.shape).encode())
        digest.update(contiguous.tobytes())
    return digest.hexdigest()[:16]


def rank_line(
    rank: int, size: int, local_rank: int, local_size: int, hostname: str, device: str
) -> str:
    """The line each rank prints at start; end-to-end tests grep for it."""
    return (
        f"{contract.RANK_PREFIX} rank={rank} size={size} local_rank={local_rank} "
        f"local_size={local_size} hostname={hostname} device={device}"
    )


def hostname() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class EpochMetrics:
    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    samples_per_sec: float
    lr: float

    @classmethod
    def from_totals(
        cls, epoch: int, totals: list[float], test: tuple[float, float], size: int, lr: float
    ) -> "EpochMetrics":
        """From an epoch's sums over the ranks, [loss x samples, correct, samples,
        seconds (each rank's)]: the training metrics of the samples this run saw."""
        samples = max(totals[2], 1.0)
        return cls(
            epoch=epoch,
            train_loss=totals[0] / samples,
            train_accuracy=totals[1] / samples,
            test_loss=test[0],
            test_accuracy=test[1],
            samples_per_sec=totals[2] / max(totals[3] / size, 1e-9),
            lr=lr,
        )

    def progress_line(self, epochs: int) -> str:
        return (
            f"epoch {self.epoch}/{epochs} loss={self.train_loss:.4f} "
            f"accuracy={self.train_accuracy:.4f} test_loss={self.test_loss:.4f} "
            f"test_accuracy={self.test_accuracy:.4f} samples/s={self.samples_per_sec:.1f} "
            f"lr={self.lr:.5f}"
        )


def run_summary(
    *,
    framework: str,
    mode: str,
    dataset: str,
    size: int,
    config: TrainConfig,
    start_epoch: int,
    resumed_from: Any,
    history: list[EpochMetrics],
    test_loss: Any,
    test_accuracy: Any,
    per_rank: list[Mapping[str, Any]],
    param_sq_norm: float,
) -> dict[str, Any]:
    """The HVJOB_RESULT summary both trainers print on rank 0."""
    return {
        "framework": framework,
        "mode": mode,
        "dataset": dataset,
        "size": size,
        "epochs": config.epochs,
        "start_epoch": start_epoch,
        "resumed_from": resumed_from,
        "global_batch_size": config.batch_size * size,
        "final_loss": history[-1].train_loss if history else None,
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "samples_per_sec": (
            sum(m.samples_per_sec for m in history) / len(history) if history else None
        ),
        "history": [m.__dict__ for m in history],
        "hostnames": [r["hostname"] for r in per_rank],
        "local_ranks": [r["local_rank"] for r in per_rank],
        "devices": [r["device"] for r in per_rank],
        "initial_checksums": [r["initial_checksum"] for r in per_rank],
        # After the broadcasts, before the first step: equal on every rank when the
        # broadcast really comes first (a broadcast after training leaves them apart).
        "start_checksums": [r["start_checksum"] for r in per_rank],
        "param_checksums": [r["checksum"] for r in per_rank],
        # Per rank, a fingerprint of each epoch's sample order: a new order every
        # epoch (DistributedSampler.set_epoch), a different shard on every rank.
        "epoch_orders": [r["epoch_orders"] for r in per_rank],
        "optimizer_updates": [r.get("optimizer_updates") for r in per_rank],
        "options": {
            "fp16_allreduce": config.fp16_allreduce,
            "adasum": config.adasum,
            "backward_passes_per_step": config.backward_passes_per_step,
            "gradient_predivide_factor": config.gradient_predivide_factor,
            "amp": config.amp,
            "amp_dtype": config.amp_dtype,
            "clip_grad_norm": config.clip_grad_norm,
            "batchnorm": config.batchnorm or config.sync_batchnorm,
            "sync_batchnorm": config.sync_batchnorm,
        },
        # Per rank: a checksum of the batch-norm running statistics (None without
        # batch norm). They are buffers, not parameters: the optimizer never
        # averages them, so only --sync-batchnorm makes them equal on every rank.
        "bn_stat_checksums": [r.get("bn_checksum") for r in per_rank],
        "param_sq_norm": param_sq_norm,
    }


def elastic_summary(
    hvd: Any,
    state: Any,
    *,
    framework: str,
    config: TrainConfig,
    dataset: str,
    host: str,
    device: str,
    checksum: str,
    test: tuple[float, float],
    param_sq_norm: float,
) -> dict[str, Any]:
    """The HVJOB_RESULT of an elastic run (torch_elastic, tf_elastic): run_summary's
    fields, every rank's (a collective), the steps, and the sizes it trained at.
    A rank that joined mid-run had no start of its own: its checksums are all the
    final one."""
    per_rank = hvd.allgather_object(
        {
            "hostname": host,
            "local_rank": hvd.local_rank(),
            "device": device,
            "initial_checksum": checksum,
            "start_checksum": checksum,
            "checksum": checksum,
            "epoch_orders": [],
            "optimizer_updates": state.step,
        },
        name="elastic_summary",
    )
    size = hvd.size()
    result = run_summary(
        framework=framework,
        mode="elastic",
        dataset=dataset,
        size=size,
        config=config,
        start_epoch=state.start_epoch,
        resumed_from=state.resumed_from,
        history=[EpochMetrics(**m) for m in state.history],
        test_loss=test[0],
        test_accuracy=test[1],
        per_rank=per_rank,
        param_sq_norm=param_sq_norm,
    )
    result["steps"] = state.step
    result["elastic"] = {"sizes": list(state.sizes), "final_size": size}
    return result


def parse_result(output: str) -> dict[str, Any]:
    """The last result line in some output, whatever launcher tags it carries."""
    for _, line in reversed(split_by_rank(output)):
        result = contract.result_in_line(line)
        if result is not None:
            return result
    raise ValueError(f"no {contract.RESULT_PREFIX} line in the output")


# Set in every process that horovodrun or mpirun starts.
LAUNCHER_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
# How long a failing rank lingers before it exits under a launcher. The launcher
# kills the other ranks as soon as one exits non-zero; the others, started at the
# same moment with the same input, need this long to print their own line too.
ERROR_GRACE_SECONDS = 1.5


def error_exit(message: str, status: int = 1, prog: str = "horovod_worker.train") -> int:
    """Print the one line that names the problem; return the exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    if any(var in os.environ for var in LAUNCHER_RANK_VARS):
        time.sleep(ERROR_GRACE_SECONDS)
    return status
