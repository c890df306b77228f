"""PyTorch + Horovod: hvd.DistributedOptimizer with DistributedSampler shards.

Order of a run, the same on every rank (collectives must run everywhere, in
the same order, or the job hangs):

1. hvd.init(), size check, device pinned by local rank, data loaded, output
   directories checked on rank 0; any rank's problem stops every rank.
2. Model and optimizer built from this rank's seed; rank 0 loads the newest
   checkpoint on --resume.
3. Parameters AND optimizer state broadcast from rank 0, before the first step
   (the seed tutorials broadcast after training, or on rank 0 only: a deadlock).
4. Epochs: sampler.set_epoch, averaged gradients, metrics summed over ranks;
   rank 0 prints progress, writes TensorBoard scalars and a checkpoint.
5. Checksums of the final parameters gathered from every rank; rank 0 prints
   the result line.
"""

import os
import re
import time
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import horovod_contract as contract
from horovod_contract.progress import ProgressReporter
from horovod_worker.common import (
    ADASUM_NEEDS_MPI,
    EpochMetrics,
    TrainConfig,
    WorkerError,
    agree_on_error,
    check_expected_size,
    checksum,
    emit,
    ensure_writable_dir,
    hostname,
    learning_rate,
    log,
    lr_scale,
    order_fingerprint,
    rank_line,
    run_summary,
)
from horovod_worker.data import DataError, Dataset, eval_shard, load
from horovod_worker.devices import (
    DeviceChoice,
    DeviceError,
    cgroup_cpu_limit,
    default_threads,
    select_for_pod,
)
from horovod_worker.preemption import Preempted, StopOnSignal
from horovod_worker.torch_layers import amp_dtype, batchnorm_checksum, convert_sync_batchnorm

CHECKPOINT_GLOB = "checkpoint-*.pt"


def visible_gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def pin_device(choice: DeviceChoice) -> torch.device:
    if choice.gpu_index is None:
        return torch.device("cpu")
    torch.cuda.set_device(choice.gpu_index)
    return torch.device("cuda", choice.gpu_index)


def build_model(dataset: Dataset, hidden: int, batchnorm: bool = False) -> nn.Module:
    height, width, channels = dataset.image_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(height * width * channels, hidden),
        *([nn.BatchNorm1d(hidden)] if batchnorm else []),
        nn.ReLU(),
        nn.Linear(hidden, dataset.num_classes),
    )


def to_nchw(images: Any) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()


def parameter_checksum(model: nn.Module) -> str:
    return checksum(p.detach().cpu().numpy() for p in model.parameters())


# checkpoint-<epochs done>.pt after an epoch; checkpoint-<epochs done>-<batches done
# in the next>.pt when stopped within one (preemption.py).
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)(?:-(\d+))?\.pt$")


def newest_checkpoint(directory: Path) -> Path | None:
    found = []
    for path in directory.glob(CHECKPOINT_GLOB):
        match = _CHECKPOINT_NAME.match(path.name)
        if match:
            found.append(((int(match.group(1)), int(match.group(2) or 0)), path))
    return max(found)[1] if found else None


def save_checkpoint(
    directory: Path,
    epoch: int,
    step: int,
    model: nn.Module,
    optimizer: Any,
    scaler: Any,
    batch: int = 0,
) -> Path:
    """Write atomically, so that a rank 0 killed mid-write leaves the previous one.
    `epoch` epochs are done, and `batch` batches of the next one."""
    name = f"checkpoint-{epoch:04d}" + (f"-{batch:06d}" if batch else "")
    path = directory / f"{name}.pt"
    tmp = path.with_suffix(".tmp")
    state = {
        "epoch": epoch,
        "step": step,
        "batch": batch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
    }
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def _allreduce_max(value: float) -> float:
    return float(hvd.allreduce(torch.tensor([value]), op=hvd.Max, name="stop_request")[0])


def _stop_with_checkpoint(
    config: TrainConfig,
    rank: int,
    epoch: int,
    step: int,
    batch: int,
    steps_per_epoch: int,
    model: nn.Module,
    optimizer: Any,
    scaler: Any,
) -> None:
    """Every rank, at the agreed step: rank 0 saves, all wait for it, all stop."""
    done_epochs, done_batches = (
        (epoch + 1, 0) if batch + 1 == steps_per_epoch else (epoch, batch + 1)
    )
    error = None
    if config.checkpoint_dir is None:
        where = "no --checkpoint-dir: nothing saved"
    else:
        where = "rank 0 wrote the checkpoint"
    if rank == 0 and config.checkpoint_dir is not None:
        try:
            path = save_checkpoint(
                config.checkpoint_dir, done_epochs, step, model, optimizer, scaler, done_batches
            )
            where = f"checkpoint {path}"
        except OSError as exc:
            error = f"SIGTERM: cannot write the checkpoint: {exc}"
    # A collective: no rank leaves (and no launcher kills rank 0) before the save.
    agree_on_error(hvd, error)
    raise Preempted(f"stopped on SIGTERM at epoch {epoch + 1}, step {step}; {where}")


def summed(values: list[float], name: str) -> list[float]:
    """Sum per-rank values over all ranks (exact global metrics)."""
    total = hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name)
    return [float(v) for v in total.tolist()]


def evaluate(
    model: nn.Module, dataset: Dataset, device: torch.device, rank: int, size: int
) -> tuple[float, float]:
    """Loss and accuracy over the whole test set: each rank its disjoint part."""
    part = eval_shard(len(dataset.x_test), rank, size)
    images = to_nchw(dataset.x_test[part]).to(device)
    labels = torch.from_numpy(dataset.y_test[part]).to(device)
    model.eval()
    with torch.no_grad():
        logits = model(images) if len(labels) else torch.zeros(0, dataset.num_classes)
        loss_sum = float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        correct = float((logits.argmax(dim=1) == labels).sum())
    if not len(labels):
        loss_sum = 0.0
    total_loss, total_correct, count = summed([loss_sum, correct, float(len(labels))], "eval")
    return total_loss / count, total_correct / count


def run(config: TrainConfig) -> dict[str, Any]:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    check_expected_size(size)
    torch.set_num_threads(config.threads or default_threads(local_size, cgroup_cpu_limit()))

    # 1. Everything that can fail on one rank, agreed on by all.
    error: str | None = None
    choice = DeviceChoice(None, "", "not selected")
    dataset: Dataset | None = None
    try:
        choice = select_for_pod(local_rank, local_size, visible_gpus(), config.allow_cpu)
        if config.adasum and not hvd.mpi_enabled():
            raise WorkerError(ADASUM_NEEDS_MPI)
        dataset = load(config.dataset, config.data_dir, config.synthetic_samples, config.image_size)
        if rank == 0 and config.checkpoint_dir is not None:
            ensure_writable_dir(config.checkpoint_dir, "checkpoint dir")
        if rank == 0 and config.log_dir is not None:
            ensure_writable_dir(config.log_dir, "log dir")
    except (DeviceError, DataError, WorkerError) as exc:
        error = str(exc)
    agree_on_error(hvd, error)
    assert dataset is not None
    device = pin_device(choice)
    host = hostname()
    emit(rank_line(rank, size, local_rank, local_size, host, choice.describe()))
    if not choice.is_gpu:
        log(rank, choice.reason)

    # 2. Model and optimizer from this rank's seed; the broadcast below makes them equal.
    torch.manual_seed(config.seed)
    model = build_model(dataset, config.hidden, config.batchnorm)
    if config.sync_batchnorm:
        model = convert_sync_batchnorm(model, choice.is_gpu)
    model = model.to(device)
    # --amp: autocast's type, and a GradScaler that scales the loss for float16 only
    # (bfloat16 has float32's range; disabled, the scaler passes everything through).
    autocast_dtype = amp_dtype(config.amp_dtype, choice.is_gpu)
    scaler = torch.amp.GradScaler(
        device.type, enabled=config.amp and autocast_dtype == torch.float16
    )
    base_optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    passes = config.backward_passes_per_step
    optimizer = hvd.DistributedOptimizer(
        base_optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
        op=hvd.Adasum if config.adasum else hvd.Average,
        backward_passes_per_step=passes,
        gradient_predivide_factor=config.gradient_predivide_factor,
    )
    scale = lr_scale(size, local_size, config.adasum, choice.is_gpu)
    initial_checksum = parameter_checksum(model)

    start_epoch, step, skip, resumed_from = 0, 0, 0, None
    error = None
    if rank == 0 and config.resume and config.checkpoint_dir is not None:
        path = newest_checkpoint(config.checkpoint_dir)
        if path is None:
            log(rank, f"--resume: no checkpoint in {config.checkpoint_dir}, starting fresh")
        else:
            try:
                state = torch.load(path, map_location=device, weights_only=True)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                if state.get("scaler"):
                    scaler.load_state_dict(state["scaler"])
                start_epoch, step, resumed_from = int(state["epoch"]), int(state["step"]), str(path)
                skip = int(state.get("batch", 0))
                log(rank, f"resumed from {path} (epoch {start_epoch}, step {step})")
            except (OSError, RuntimeError, KeyError, ValueError) as exc:
                error = f"cannot resume from {path}: {exc}"
    agree_on_error(hvd, error)
    start_epoch, step, skip, resumed_from = hvd.broadcast_object(
        (start_epoch, step, skip, resumed_from), root_rank=0, name="resume_point"
    )

    # 3. Every rank takes part in both broadcasts, before the first step.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start_checksum = parameter_checksum(model)
    data_seed = hvd.broadcast_object(config.seed, root_rank=0, name="data_seed")

    sampler: DistributedSampler[Any] = DistributedSampler(
        TensorDataset(torch.arange(len(dataset.y_train))),
        num_replicas=size,
        rank=rank,
        shuffle=True,
        seed=data_seed,
    )
    train_set = TensorDataset(to_nchw(dataset.x_train), torch.from_numpy(dataset.y_train))
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler)
    steps_per_epoch = len(loader)

    writer = None
    if rank == 0 and config.log_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(config.log_dir))

    # 4. Training.
    history: list[EpochMetrics] = []
    epoch_orders: list[str] = []
    updates = 0  # optimizer steps: one per --backward-passes-per-step batches
    forward_dtype = ""  # the logits' type under autocast: proof that --amp took effect
    skipped_updates = 0  # float16 steps the scaler skipped (inf/NaN gradients)
    # Horovod's pattern when something must see the averaged gradients before the
    # update (the scaler's unscale_, clipping): synchronize() waits for the
    # allreduces, and step() inside skip_synchronize() does not wait again.
    synchronized_step = config.amp or config.clip_grad_norm is not None
    lr = learning_rate(step, steps_per_epoch, config.lr, scale, config.warmup_epochs)
    stop = StopOnSignal()
    progress = ProgressReporter(rank, size)  # rank 0's HVJOB_PROGRESS line, now and then
    samples_done = 0
    for epoch in range(start_epoch, config.epochs):
        sampler.set_epoch(epoch)  # a new shuffle, the same on every rank
        epoch_orders.append(order_fingerprint(iter(sampler)))
        model.train()
        loss_sum = correct = count = 0.0
        started = time.perf_counter()
        optimizer.zero_grad()
        for batch, (images, labels) in enumerate(loader):
            if epoch == start_epoch and batch < skip:
                continue  # done before the preemption this run resumes from
            lr = learning_rate(step, steps_per_epoch, config.lr, scale, config.warmup_epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
            images, labels = images.to(device), labels.to(device)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=config.amp):
                logits = model(images)
            forward_dtype = forward_dtype or str(logits.dtype).removeprefix("torch.")
            logits = logits.float()
            loss = nn.functional.cross_entropy(logits, labels)
            # With accumulation the gradient is the mean over the N batches.
            scaler.scale(loss / passes).backward()  # type: ignore[no-untyped-call]
            # One allreduce and update per N backward passes; the epoch's last batch
            # updates with what it has (step() allreduces the gradients still pending).
            updated = (batch + 1) % passes == 0 or batch + 1 == steps_per_epoch
            if updated:
                if synchronized_step:
                    optimizer.synchronize()
                    scaler.unscale_(optimizer)
                    if config.clip_grad_norm is not None:
                        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
                    with optimizer.skip_synchronize():
                        scale_before = scaler.get_scale() if scaler.is_enabled() else 0.0
                        scaler.step(optimizer)
                    scaler.update()
                    # The scale drops only when the step was skipped (the same on
                    # every rank: they all unscale the same averaged gradients).
                    if scaler.is_enabled() and scaler.get_scale() < scale_before:
                        skipped_updates += 1
                else:
                    optimizer.step()
                optimizer.zero_grad()
                updates += 1
            step += 1
            samples_done += len(labels) * size
            progress.step(step, epoch=epoch, samples=samples_done)
            if updated and stop.due(step) and stop.agreed(_allreduce_max):
                _stop_with_checkpoint(
                    config, rank, epoch, step, batch, steps_per_epoch, model, optimizer, scaler
                )
            loss_sum += loss.item() * len(labels)
            correct += float((logits.argmax(dim=1) == labels).sum())
            count += len(labels)
        elapsed = time.perf_counter() - started
        total_loss, total_correct, total_count, elapsed_sum = summed(
            [loss_sum, correct, count, elapsed], "train"
        )
        test_loss, test_accuracy = evaluate(model, dataset, device, rank, size)
        metrics = EpochMetrics(
            epoch=epoch + 1,
            train_loss=total_loss / total_count,
            train_accuracy=total_correct / total_count,
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            samples_per_sec=total_count / (elapsed_sum / size),
            lr=lr,
        )
        history.append(metrics)
        if rank == 0:
            log(rank, metrics.progress_line(config.epochs))
            if writer is not None:
                for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                    writer.add_scalar(key, getattr(metrics, key), epoch + 1)
                writer.add_scalar("samples_per_sec", metrics.samples_per_sec, epoch + 1)
                writer.add_scalar("lr", lr, epoch + 1)
                writer.flush()
            if config.checkpoint_dir is not None:
                save_checkpoint(config.checkpoint_dir, epoch + 1, step, model, optimizer, scaler)
    if writer is not None:
        writer.close()

    # 5. Summary from every rank, printed by rank 0.
    if history:
        test_loss, test_accuracy = history[-1].test_loss, history[-1].test_accuracy
    else:
        test_loss, test_accuracy = evaluate(model, dataset, device, rank, size)
    final_checksum = parameter_checksum(model)
    per_rank = hvd.allgather_object(
        {
            "hostname": host,
            "local_rank": local_rank,
            "device": choice.describe(),
            "initial_checksum": initial_checksum,
            "start_checksum": start_checksum,
            "checksum": final_checksum,
            "epoch_orders": epoch_orders,
            "optimizer_updates": updates,
            "bn_checksum": batchnorm_checksum(model),
        },
        name="rank_summary",
    )
    param_norm = float(sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()))
    result = run_summary(
        framework="pytorch",
        mode="optimizer",
        dataset=dataset.name,
        size=size,
        config=config,
        start_epoch=start_epoch,
        resumed_from=resumed_from,
        history=history,
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        per_rank=per_rank,
        param_sq_norm=param_norm,
    )
    result["amp"] = {
        "enabled": config.amp,
        "autocast_dtype": str(autocast_dtype).removeprefix("torch.") if config.amp else None,
        "forward_dtype": forward_dtype,
        "loss_scaling": scaler.is_enabled(),
        "final_loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
        "skipped_updates": skipped_updates,
    }
    result["batchnorm_layer"] = next(
        (type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__), None
    )
    if rank == 0:
        emit(contract.result_line(result))
    return result
