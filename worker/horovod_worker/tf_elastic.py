"""TensorFlow under Horovod elastic: what train.py runs when HOROVOD_ELASTIC=1.

The same pattern as torch_elastic.py, with Horovod's ``TensorFlowKerasState``
(model weights, optimizer slots, and the epoch, the global step, the samples
of the epoch done, the history and the sizes as plain values) and the custom
loop (``--mode tape``; Keras ``fit`` is refused): every collective inside the
function ``hvd.elastic.run`` wraps, a commit every HVJOB_COMMIT_EVERY steps
and at each epoch's end, the learning rate scaled by ``hvd.size()`` at every
step, and SIGTERM handled as in torch_elastic (all ranks: rank 0 checkpoints
and all stop; some: they commit and leave).

After a reset the epoch goes on where the last commit left it, at the new
size: the order of the epoch is the same on every rank (epoch_order, from the
seed and the epoch), the samples done are skipped, and the rest is sharded
over the ranks there are now.
"""

from __future__ import annotations

import os
import time
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

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
from horovod_worker.data import Dataset, load
from horovod_worker.devices import cgroup_cpu_limit, default_threads
from horovod_worker.preemption import (
    COMMIT_EVERY_ENV,
    DEFAULT_COMMIT_EVERY,
    FINISH_FILE_ENV,
    StopOnSignal,
    commit_or_leave,
    elastic_look,
    finish_file_seen,
)
from horovod_worker.tf_trainer import (
    Checkpoints,
    build_model,
    build_optimizer_state,
    check_legacy_keras,
    epoch_order,
    evaluate,
    keras,
    pin_device,
    summed,
    weights_checksum,
)


def unsupported(config: TrainConfig) -> str | None:
    if config.mode != "tape":
        return "elastic training runs the custom loop: use --mode tape (Keras fit is not elastic)"
    if config.adasum:
        return "--adasum: Horovod has Adasum under MPI only, and elastic training runs Gloo"
    if config.amp:
        return "--amp is not supported with elastic training"
    if config.sync_batchnorm:
        return "--sync-batchnorm is not supported with elastic training under TensorFlow"
    return None


def remaining_batches(
    dataset: Dataset, state: Any, config: TrainConfig, rank: int, size: int
) -> Any:
    """This rank's part of what is left of the epoch, at the current size."""
    order = epoch_order(len(dataset.y_train), 1, config.seed, state.epoch)[state.processed :]
    order = order[: len(order) - len(order) % size]
    data = tf.data.Dataset.from_tensor_slices((dataset.x_train[order], dataset.y_train[order]))
    return data.shard(size, rank).batch(config.batch_size)


def run(config: TrainConfig) -> dict[str, Any]:
    hvd.init()
    problem = unsupported(config)
    if problem:
        raise WorkerError(problem)
    check_legacy_keras()
    threads = config.threads or default_threads(hvd.local_size(), cgroup_cpu_limit())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    choice = pin_device(hvd.local_rank(), hvd.local_size(), config.allow_cpu)
    dataset = load(config.dataset, config.data_dir, config.synthetic_samples, config.image_size)
    host = hostname()

    keras.utils.set_random_seed(config.seed)
    model = build_model(dataset, config.hidden, config.batchnorm)
    optimizer = keras.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
    build_optimizer_state(optimizer, model)  # the same variables on every rank, for sync()
    start_epoch, step, resumed_from, checkpoints = 0, 0, None, None
    if hvd.rank() == 0 and config.checkpoint_dir is not None:
        ensure_writable_dir(config.checkpoint_dir, "checkpoint dir")
        checkpoints = Checkpoints(config.checkpoint_dir, model, optimizer)
        restored = checkpoints.restore_newest() if config.resume else None
        if restored is not None:
            start_epoch, step, resumed_from = restored
            log(0, f"resumed from {resumed_from} (epoch {start_epoch}, step {step})")
    state = hvd.elastic.TensorFlowKerasState(
        model,
        optimizer,
        epoch=start_epoch,
        step=step,
        processed=0,
        start_epoch=start_epoch,
        resumed_from=resumed_from,
        history=[],
        sizes=[],
    )

    def on_reset() -> None:
        state.sizes.append(hvd.size())
        log(hvd.rank(), f"reset: now rank {hvd.rank()} of {hvd.size()}")

    state.register_reset_callbacks([on_reset])
    commit_every = int(os.environ.get(COMMIT_EVERY_ENV, DEFAULT_COMMIT_EVERY))
    stop = StopOnSignal()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
    def train_step(images: Any, labels: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
        tape = hvd.DistributedGradientTape(
            tape,
            compression=compression,
            gradient_predivide_factor=config.gradient_predivide_factor,
        )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss, logits

    printed = False
    progress = ProgressReporter(-1, 0)  # made rank 0's once the world is known

    @hvd.elastic.run  # type: ignore[untyped-decorator]
    def train(state: Any) -> dict[str, Any]:
        nonlocal printed
        rank, size = hvd.rank(), hvd.size()

        def say(message: str) -> None:
            log(rank, message)

        if not state.sizes or state.sizes[-1] != size:
            state.sizes.append(size)
        if not printed:
            line = rank_line(
                rank, size, hvd.local_rank(), hvd.local_size(), host, choice.describe()
            )
            emit(line)
            printed = True
        progress.rank, progress.size = rank, size  # a reset can change both
        scale = lr_scale(size, hvd.local_size(), False, choice.is_gpu)
        steps_per_epoch = max(1, -(-len(dataset.y_train) // (config.batch_size * size)))
        lr = learning_rate(state.step, steps_per_epoch, config.lr, scale, config.warmup_epochs)
        while state.epoch < config.epochs:
            loss_sum = correct = count = 0.0
            started = time.perf_counter()
            for images, labels in remaining_batches(dataset, state, config, rank, size):
                lr = learning_rate(
                    state.step, steps_per_epoch, config.lr, scale, config.warmup_epochs
                )
                optimizer.learning_rate.assign(lr)
                loss, logits = train_step(images, labels)
                n = int(labels.shape[0])
                loss_sum += float(loss) * n
                correct += float(np.sum(np.argmax(logits.numpy(), axis=1) == labels.numpy()))
                count += n
                state.step += 1
                state.processed += n * size
                progress.step(state.step, epoch=state.epoch, samples=state.processed)
                if stop.due(state.step):
                    _on_signals(state, stop, checkpoints, size)
                if state.step % commit_every == 0:
                    commit_or_leave(state.commit, stop, state.step, say)
            elapsed = time.perf_counter() - started
            *totals, finish = summed(
                [loss_sum, correct, count, elapsed, finish_file_seen()], "train"
            )
            test_loss, test_accuracy = evaluate(model, dataset, rank, size)
            metrics = EpochMetrics.from_totals(
                state.epoch + 1, totals, (test_loss, test_accuracy), size, lr
            )
            state.history.append(metrics.__dict__)
            state.epoch += 1
            state.processed = 0
            if rank == 0:
                log(rank, f"{metrics.progress_line(config.epochs)} size={size}")
                if checkpoints is not None:
                    checkpoints.save(state.epoch, state.step)
            commit_or_leave(state.commit, stop, state.step, say)
            if finish:
                if rank == 0:
                    log(rank, f"{FINISH_FILE_ENV} exists: training ends after epoch {state.epoch}")
                break
        return _summary(state, config, dataset, host, choice.describe(), rank, size)

    result: dict[str, Any] = train(state)
    if hvd.rank() == 0:
        emit(contract.result_line(result))
    return result


def _on_signals(state: Any, stop: StopOnSignal, checkpoints: Any, size: int) -> None:
    """As in torch_elastic. The checkpoint has the weights, the epoch and the step
    but no sample position: a resume redoes the interrupted epoch from its start."""

    def checkpoint() -> str:
        if hvd.rank() != 0:
            return "rank 0 wrote the checkpoint"
        if checkpoints is None:
            return "no --checkpoint-dir: nothing saved"
        checkpoints.save(state.epoch, state.step)
        return f"checkpoint of epoch {state.epoch}, step {state.step}"

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
    state: Any, config: TrainConfig, dataset: Dataset, host: str, device: str, rank: int, size: int
) -> dict[str, Any]:
    last = state.history[-1] if state.history else None
    test = (
        (last["test_loss"], last["test_accuracy"])
        if last
        else evaluate(state.model, dataset, rank, size)
    )
    return elastic_summary(
        hvd,
        state,
        framework="tensorflow",
        config=config,
        dataset=dataset.name,
        host=host,
        device=device,
        checksum=weights_checksum(state.model),
        test=test,
        param_sq_norm=float(sum(float(np.sum(np.square(w))) for w in state.model.get_weights())),
    )
