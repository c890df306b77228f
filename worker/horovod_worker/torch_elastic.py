"""PyTorch under Horovod elastic: what train.py runs when Horovod says HOROVOD_ELASTIC=1.

Workers may leave and join while this trains (an elastic HorovodJob, or
``horovodrun --min-np/--max-np``). The pattern is Horovod's (hvd.elastic.run):

- Everything that the ranks must agree on lives in a ``hvd.elastic.TorchState``:
  the model, the optimizer, an ``ElasticSampler`` (which samples of the epoch are
  done), the epoch, the global step and the epoch history. It is committed to
  memory every ``HVJOB_COMMIT_EVERY`` steps and at the end of every epoch.
- Every collective runs inside the function that ``hvd.elastic.run`` wraps. A
  rank that disappears makes the next collective raise on the others, which
  roll back to the last commit, meet the driver's new plan and go on; a worker
  that arrives makes the next commit raise HostsUpdatedInterrupt on every rank,
  and the newcomer receives the state from rank 0 (``state.sync()``).
- The learning rate follows the world size: its scale is read from
  ``hvd.size()`` at every step, so after a reset it is rescaled (the reset
  callback records each new size in the state and says so).
- SIGTERM (preemption.py): every HVJOB_STOP_CHECK_EVERY steps the ranks add up
  who got one. All of them: the job is being suspended or deleted, so rank 0
  writes a checkpoint of that step and all stop (exit 143); ``--resume`` goes
  on from it, at any size. Only some: those ranks' pods are going away (deleted,
  evicted, drained); all commit first, then those leave (exit 143) and the
  others go on without them, losing no step.

Not here: ``--adasum`` (Horovod has it under MPI only, and elastic runs Gloo),
``--backward-passes-per-step`` above 1 and ``--amp`` (their state is not in
TorchState); each is refused with a one-line error.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import horovod_contract as contract
from horovod_contract.progress import ProgressReporter
from horovod_worker.common import (
    EpochMetrics,
    TrainConfig,
    WorkerError,
    elastic_summary,
    emit,
    ensure_writable_dir,
    hostname,
    learning_rate,
    log,
    lr_scale,
    rank_line,
)
from horovod_worker.data import load
from horovod_worker.devices import cgroup_cpu_limit, default_threads, select_for_pod
from horovod_worker.preemption import (
    COMMIT_EVERY_ENV,
    DEFAULT_COMMIT_EVERY,
    FINISH_FILE_ENV,
    StopOnSignal,
    commit_or_leave,
    elastic_look,
    finish_file_seen,
)
from horovod_worker.torch_layers import convert_sync_batchnorm
from horovod_worker.torch_trainer import (
    build_model,
    evaluate,
    newest_checkpoint,
    parameter_checksum,
    pin_device,
    summed,
    to_nchw,
    visible_gpus,
)


def unsupported(config: TrainConfig) -> str | None:
    if config.adasum:
        return "--adasum: Horovod has Adasum under MPI only, and elastic training runs Gloo"
    if config.backward_passes_per_step > 1:
        return "--backward-passes-per-step above 1 is not supported with elastic training"
    if config.amp:
        return "--amp is not supported with elastic training (its scaler is not in the state)"
    return None


def save_checkpoint(directory: Path, state: Any, size: int, epoch: int) -> Path:
    """An elastic checkpoint: `epoch` epochs done, the step, and the samples of the
    next epoch done (at any size: ElasticSampler counts samples, not batches)."""
    processed = int(state.sampler.processed_num)
    name = f"checkpoint-{epoch:04d}" + (f"-{processed:06d}" if processed else "")
    path = directory / f"{name}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "epoch": epoch,
            "step": state.step,
            "processed": processed,
            "batch": 0,
            "size": size,
            "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict(),
        },
        tmp,
    )
    os.replace(tmp, path)
    return path


def run(config: TrainConfig) -> dict[str, Any]:
    hvd.init()
    problem = unsupported(config)
    if problem:
        raise WorkerError(problem)
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    torch.set_num_threads(config.threads or default_threads(local_size, cgroup_cpu_limit()))
    # No agreement on errors here (a collective outside the elastic loop could
    # deadlock a newcomer): a rank that cannot start fails alone, and a problem
    # every rank has fails them all, which ends the job.
    choice = select_for_pod(local_rank, local_size, visible_gpus(), config.allow_cpu)
    dataset = load(config.dataset, config.data_dir, config.synthetic_samples, config.image_size)
    device = pin_device(choice)
    host = hostname()

    torch.manual_seed(config.seed)
    model = build_model(dataset, config.hidden, config.batchnorm)
    if config.sync_batchnorm:
        model = convert_sync_batchnorm(model, choice.is_gpu)
    model = model.to(device)
    base_optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    optimizer = hvd.DistributedOptimizer(
        base_optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
        gradient_predivide_factor=config.gradient_predivide_factor,
    )
    sampler = hvd.elastic.ElasticSampler(
        TensorDataset(torch.arange(len(dataset.y_train))), shuffle=True, seed=config.seed
    )
    start_epoch, step, resumed_from = 0, 0, None
    if hvd.rank() == 0 and config.checkpoint_dir is not None:
        ensure_writable_dir(config.checkpoint_dir, "checkpoint dir")
        path = newest_checkpoint(config.checkpoint_dir) if config.resume else None
        if path is not None:
            saved = torch.load(path, map_location=device, weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            start_epoch, step, resumed_from = int(saved["epoch"]), int(saved["step"]), str(path)
            processed = int(saved.get("processed") or 0)
            sampler.load_state_dict({"epoch": start_epoch, "processed_num": processed})
            log(0, f"resumed from {path} (epoch {start_epoch}, step {step}, {processed} samples)")
    # Rank 0's values reach every rank in the first state.sync().
    state = hvd.elastic.TorchState(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=start_epoch,
        step=step,
        start_epoch=start_epoch,
        resumed_from=resumed_from,
        history=[],
        sizes=[],
    )

    def on_reset() -> None:
        state.sizes.append(hvd.size())
        log(
            hvd.rank(),
            f"reset: now rank {hvd.rank()} of {hvd.size()}; the learning rate scales to "
            f"{lr_scale(hvd.size(), hvd.local_size(), False, choice.is_gpu)}x",
        )

    state.register_reset_callbacks([on_reset])
    train_set = TensorDataset(to_nchw(dataset.x_train), torch.from_numpy(dataset.y_train))
    commit_every = int(os.environ.get(COMMIT_EVERY_ENV, DEFAULT_COMMIT_EVERY))
    stop = StopOnSignal()
    printed_rank_line = False
    progress = ProgressReporter(-1, 0)  # made rank 0's once the world is known

    @hvd.elastic.run  # type: ignore[untyped-decorator]
    def train(state: Any) -> dict[str, Any]:
        nonlocal printed_rank_line
        rank, size = hvd.rank(), hvd.size()

        def say(message: str) -> None:
            log(rank, message)

        if not state.sizes or state.sizes[-1] != size:
            state.sizes.append(size)
        if not printed_rank_line:
            line = rank_line(
                rank, size, hvd.local_rank(), hvd.local_size(), host, choice.describe()
            )
            emit(line)
            printed_rank_line = True
        progress.rank, progress.size = rank, size  # a reset can change both
        scale = lr_scale(size, hvd.local_size(), False, choice.is_gpu)
        steps_per_epoch = max(1, math.ceil(len(dataset.y_train) / (config.batch_size * size)))
        lr = learning_rate(state.step, steps_per_epoch, config.lr, scale, config.warmup_epochs)
        while state.epoch < config.epochs:
            state.model.train()
            loader = DataLoader(train_set, batch_size=config.batch_size, sampler=state.sampler)
            loss_sum = correct = count = 0.0
            started = time.perf_counter()
            for images, labels in loader:
                lr = learning_rate(
                    state.step, steps_per_epoch, config.lr, scale, config.warmup_epochs
                )
                for group in state.optimizer.param_groups:
                    group["lr"] = lr
                images, labels = images.to(device), labels.to(device)
                state.optimizer.zero_grad()
                logits = state.model(images).float()
                loss = nn.functional.cross_entropy(logits, labels)
                loss.backward()  # type: ignore[no-untyped-call]
                if config.clip_grad_norm is not None:
                    state.optimizer.synchronize()
                    nn.utils.clip_grad_norm_(state.model.parameters(), config.clip_grad_norm)
                    with state.optimizer.skip_synchronize():
                        state.optimizer.step()
                else:
                    state.optimizer.step()
                state.step += 1
                state.sampler.record_batch(0, config.batch_size)
                samples = state.step * config.batch_size * size
                progress.step(state.step, epoch=state.epoch, samples=samples)
                loss_sum += loss.item() * len(labels)
                correct += float((logits.argmax(dim=1) == labels).sum())
                count += len(labels)
                if stop.due(state.step):
                    _on_signals(state, stop, config, size)
                if state.step % commit_every == 0:
                    commit_or_leave(state.commit, stop, state.step, say)
            elapsed = time.perf_counter() - started
            *totals, finish = summed(
                [loss_sum, correct, count, elapsed, finish_file_seen()], "train"
            )
            test_loss, test_accuracy = evaluate(state.model, dataset, device, rank, size)
            metrics = EpochMetrics.from_totals(
                state.epoch + 1, totals, (test_loss, test_accuracy), size, lr
            )
            state.history.append(metrics.__dict__)
            # The next epoch's order, and none of its samples done (ElasticSampler
            # wants this at the end of an epoch, so that a reset keeps what is done).
            state.sampler.set_epoch(state.epoch + 1)
            if rank == 0:
                log(rank, f"{metrics.progress_line(config.epochs)} size={size}")
                if config.checkpoint_dir is not None:
                    save_checkpoint(config.checkpoint_dir, state, size, state.epoch + 1)
            state.epoch += 1
            commit_or_leave(state.commit, stop, state.step, say)
            if finish:
                if rank == 0:
                    log(rank, f"{FINISH_FILE_ENV} exists: training ends after epoch {state.epoch}")
                break
        return _summary(state, config, dataset, device, host, choice.describe(), rank, size)

    result: dict[str, Any] = train(state)
    if hvd.rank() == 0:
        emit(contract.result_line(result))
    return result


def _on_signals(state: Any, stop: StopOnSignal, config: TrainConfig, size: int) -> None:
    def checkpoint() -> str:
        if hvd.rank() != 0:
            return "rank 0 wrote the checkpoint"
        if config.checkpoint_dir is None:
            return "no --checkpoint-dir: nothing saved"
        return f"checkpoint {save_checkpoint(config.checkpoint_dir, state, size, state.epoch)}"

    elastic_look(
        stop,
        lambda value, name: summed([value], name)[0],
        size,
        state.step,
        checkpoint,
        state.commit,
        lambda message: log(hvd.rank(), message),
    )


def _summary(
    state: Any,
    config: TrainConfig,
    dataset: Any,
    device: torch.device,
    host: str,
    device_name: str,
    rank: int,
    size: int,
) -> dict[str, Any]:
    last = state.history[-1] if state.history else None
    test = (
        (last["test_loss"], last["test_accuracy"])
        if last
        else evaluate(state.model, dataset, device, rank, size)
    )
    norm = float(sum(float(p.detach().double().pow(2).sum()) for p in state.model.parameters()))
    return elastic_summary(
        hvd,
        state,
        framework="pytorch",
        config=config,
        dataset=dataset.name,
        host=host,
        device=device_name,
        checksum=parameter_checksum(state.model),
        test=test,
        param_sq_norm=norm,
    )
