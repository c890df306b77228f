"""TensorFlow 2 + Horovod: a DistributedGradientTape loop, or Keras model.fit.

Both paths follow the order of torch_trainer (see its docstring): checks agreed
by all ranks, model and optimizer state built before the first step, then
broadcast from rank 0, sharded data reshuffled per epoch, metrics summed over
ranks, checkpoints and TensorBoard logs from rank 0, checksums gathered.

Keras must be tf-keras (Keras 2): with Keras 3, horovod.tensorflow.keras's
DistributedOptimizer silently does not average inside fit, and ranks end with
different weights. TF_USE_LEGACY_KERAS=1 selects tf-keras; it is read when
TensorFlow is imported, so it is set before the import below.
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import tensorflow as tf

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

keras = tf.keras


def keras_version() -> str:
    """Which Keras tf.keras is: "tf-keras 2.21.0" or, wrongly here, "keras 3.x"."""
    package = keras.Model.__module__.split(".")[0]
    module = __import__(package)
    return f"{package.replace('_', '-')} {getattr(module, '__version__', '?')}"


def check_legacy_keras() -> None:
    version = keras_version()
    if not version.startswith("tf-keras 2."):
        raise WorkerError(
            f"tf.keras is {version}: horovod.tensorflow.keras needs tf-keras (Keras 2) "
            f"with TF_USE_LEGACY_KERAS=1; install tf-keras=={tf.__version__}"
        )


def pin_device(local_rank: int, local_size: int, allow_cpu: bool = False) -> DeviceChoice:
    """Make only this rank's GPU visible to TensorFlow, with memory growth."""
    gpus = tf.config.list_physical_devices("GPU")
    choice = select_for_pod(local_rank, local_size, [gpu.name for gpu in gpus], allow_cpu)
    if choice.gpu_index is not None:
        gpu = gpus[choice.gpu_index]
        try:
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as exc:
            raise DeviceError(f"cannot pin {gpu.name}: {exc}") from None
    return choice


def build_model(
    dataset: Dataset, hidden: int, batchnorm: bool = False, sync_batchnorm: bool = False
) -> Any:
    if sync_batchnorm:
        # Moments allreduced over all ranks (CPU and GPU alike: plain TF ops).
        norm: list[Any] = [hvd.SyncBatchNormalization()]
    elif batchnorm:
        norm = [keras.layers.BatchNormalization()]
    else:
        norm = []
    model = keras.Sequential(
        [
            keras.layers.Flatten(input_shape=dataset.image_shape),
            keras.layers.Dense(hidden, activation=None if norm else "relu"),
            *norm,
            *([keras.layers.ReLU()] if norm else []),
            # Logits in float32 under a mixed policy: a float16 softmax overflows.
            keras.layers.Dense(dataset.num_classes, dtype="float32"),
        ]
    )
    return model


def amp_policy(config: TrainConfig, on_gpu: bool) -> str | None:
    """The Keras mixed-precision policy of --amp: float16 on GPUs, bfloat16 on CPUs."""
    if not config.amp:
        return None
    dtype = config.amp_dtype
    if dtype == "auto":
        dtype = "float16" if on_gpu else "bfloat16"
    return f"mixed_{dtype}"


def forward_dtype(model: Any, images: Any) -> str:
    """The type the hidden layer really computes in (proof that a policy took effect)."""
    return str(model.layers[1](model.layers[0](images[:1])).dtype.name)


def batchnorm_checksum(model: Any) -> str | None:
    stats = [
        np.asarray(variable)
        for layer in model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
        for variable in (layer.moving_mean, layer.moving_variance)
    ]
    return checksum(stats) if stats else None


def optimizer_variables(optimizer: Any) -> list[Any]:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer_state(optimizer: Any, model: Any) -> None:
    """Create the optimizer's slots now, so that they are broadcast before step one.

    Keras creates them lazily in the first apply_gradients, which is why
    Horovod's examples broadcast after the first batch.
    """
    if hasattr(optimizer, "build"):
        optimizer.build(model.trainable_variables)
    else:  # legacy optimizers
        optimizer._create_all_weights(model.trainable_variables)


def weights_checksum(model: Any) -> str:
    """Checksum of the trainable weights (batch norm's moving statistics are not
    averaged by the optimizer: batchnorm_checksum covers them)."""
    return checksum(np.asarray(w) for w in model.trainable_weights)


def epoch_order(num_samples: int, size: int, seed: int, epoch: int) -> np.ndarray:
    """The global order of one epoch, the same on every rank, length a multiple of size.

    Shuffling the whole set and then sharding gives every rank a new part each
    epoch; trimming to a multiple of size gives every rank the same number of
    steps (otherwise one rank waits forever in an allreduce).
    """
    order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    return order[: num_samples - num_samples % size]


def epoch_dataset(
    dataset: Dataset, size: int, rank: int, seed: int, epoch: int, batch_size: int
) -> Any:
    order = epoch_order(len(dataset.y_train), size, seed, epoch)
    data = tf.data.Dataset.from_tensor_slices((dataset.x_train[order], dataset.y_train[order]))
    return data.shard(size, rank).batch(batch_size)


def steps_per_epoch(dataset: Dataset, size: int, batch_size: int) -> int:
    per_rank = (len(dataset.y_train) - len(dataset.y_train) % size) // size
    return -(-per_rank // batch_size)


def summed(values: list[float], name: str) -> list[float]:
    total = hvd.allreduce(tf.constant(values, dtype=tf.float64), op=hvd.Sum, name=name)
    return [float(v) for v in total.numpy()]


def evaluate(model: Any, dataset: Dataset, rank: int, size: int) -> tuple[float, float]:
    part = eval_shard(len(dataset.y_test), rank, size)
    images, labels = dataset.x_test[part], dataset.y_test[part]
    loss_sum = correct = 0.0
    if len(labels):
        logits = model(images, training=False)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss_sum = float(tf.reduce_sum(losses))
        correct = float(np.sum(np.argmax(logits.numpy(), axis=1) == labels))
    total_loss, total_correct, count = summed([loss_sum, correct, float(len(labels))], "eval")
    return total_loss / count, total_correct / count


class Checkpoints:
    """Model, optimizer, epoch and step in a tf.train.Checkpoint; rank 0 only."""

    def __init__(self, directory: Path, model: Any, optimizer: Any) -> None:
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, epoch=self.epoch, step=self.step
        )
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=None)

    def restore_newest(self) -> tuple[int, int, str] | None:
        path = self.manager.latest_checkpoint
        if path is None:
            return None
        self.checkpoint.restore(path).assert_existing_objects_matched()
        return int(self.epoch.numpy()), int(self.step.numpy()), str(path)

    def save(self, epoch: int, step: int) -> None:
        self.epoch.assign(epoch)
        self.step.assign(step)
        self.manager.save(checkpoint_number=epoch)


def run(config: TrainConfig) -> dict[str, Any]:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    check_expected_size(size)
    threads = config.threads or default_threads(local_size, cgroup_cpu_limit())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    error: str | None = None
    choice = DeviceChoice(None, "", "not selected")
    dataset: Dataset | None = None
    try:
        # Before anything that could start TensorFlow's runtime: devices can be
        # hidden only until then.
        choice = pin_device(local_rank, local_size, config.allow_cpu)
        if config.adasum and not hvd.mpi_enabled():
            raise WorkerError(ADASUM_NEEDS_MPI)
        check_legacy_keras()
        dataset = load(config.dataset, config.data_dir, config.synthetic_samples, config.image_size)
        if rank == 0 and config.checkpoint_dir is not None:
            ensure_writable_dir(config.checkpoint_dir, "checkpoint dir")
        if rank == 0 and config.log_dir is not None:
            ensure_writable_dir(config.log_dir, "log dir")
    except (DeviceError, DataError, WorkerError) as exc:
        error = str(exc)
    agree_on_error(hvd, error)
    assert dataset is not None
    host = hostname()
    emit(rank_line(rank, size, local_rank, local_size, host, choice.describe()))
    if not choice.is_gpu:
        log(rank, choice.reason)

    # The model from this rank's seed; the broadcast below makes all ranks equal.
    keras.utils.set_random_seed(config.seed)
    policy = amp_policy(config, choice.is_gpu)
    if policy is not None:
        keras.mixed_precision.set_global_policy(policy)
    model = build_model(dataset, config.hidden, config.batchnorm, config.sync_batchnorm)
    optimizer = keras.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
    if policy == "mixed_float16" and config.mode == "tape":
        # float16 gradients underflow without loss scaling; bfloat16 has float32's
        # range. (model.compile wraps the optimizer itself in --mode fit.)
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    if config.mode == "fit":
        optimizer = hvd_keras.DistributedOptimizer(
            optimizer,
            op=hvd.Adasum if config.adasum else hvd.Average,
            compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=config.backward_passes_per_step,
            average_aggregated_gradients=True,
            gradient_predivide_factor=config.gradient_predivide_factor,
        )
    build_optimizer_state(optimizer, model)
    initial_checksum = weights_checksum(model)

    checkpoints = None
    start_epoch, step, resumed_from = 0, 0, None
    error = None
    if rank == 0 and config.checkpoint_dir is not None:
        checkpoints = Checkpoints(config.checkpoint_dir, model, optimizer)
        if config.resume:
            try:
                restored = checkpoints.restore_newest()
            except (tf.errors.OpError, AssertionError, ValueError) as exc:
                error = f"cannot resume from {checkpoints.manager.latest_checkpoint}: {exc}"
            else:
                if restored is None:
                    log(rank, f"--resume: no checkpoint in {config.checkpoint_dir}, starting fresh")
                else:
                    start_epoch, step, resumed_from = restored
                    log(rank, f"resumed from {resumed_from} (epoch {start_epoch}, step {step})")
    agree_on_error(hvd, error)
    start_epoch, step, resumed_from = hvd.broadcast_object(
        (start_epoch, step, resumed_from), root_rank=0, name="resume_point"
    )

    # Every rank, before the first step: weights and optimizer slots from rank 0.
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer_variables(optimizer), root_rank=0)
    data_seed = hvd.broadcast_object(config.seed, root_rank=0, name="data_seed")
    start_checksum = weights_checksum(model)

    writer = None
    if rank == 0 and config.log_dir is not None:
        writer = tf.summary.create_file_writer(str(config.log_dir))

    steps = steps_per_epoch(dataset, size, config.batch_size)
    progress = ProgressReporter(rank, size)  # rank 0's HVJOB_PROGRESS line, now and then
    if config.mode == "fit":
        train_epoch = _fit_epochs(
            config, model, optimizer, dataset, size, rank, data_seed, steps, progress
        )
    else:
        # Checkpoint on SIGTERM (preemption.py), in the custom loop: the ranks look
        # at the signal together every HVJOB_STOP_CHECK_EVERY steps.
        stop = StopOnSignal()

        def on_step(epoch: int, step: int) -> None:
            progress.step(step, epoch=epoch, samples=step * config.batch_size * size)
            if stop.due(step) and stop.agreed(_allreduce_max):
                _stop_with_checkpoint(checkpoints, rank, epoch, step)

        # A checkpoint's batches done within its epoch, from its step (the same
        # size and batch size give the same steps per epoch; anything else starts
        # that epoch over).
        done = step - start_epoch * steps
        skip = (start_epoch, done if 0 < done < steps else 0)
        train_epoch = _tape_epochs(
            config, model, optimizer, dataset, size, rank, data_seed, steps, on_step, skip
        )

    history: list[EpochMetrics] = []
    epoch_orders: list[str] = []
    for epoch in range(start_epoch, config.epochs):
        order = epoch_order(len(dataset.y_train), size, data_seed, epoch)
        epoch_orders.append(order_fingerprint(order[rank::size]))  # this rank's shard
        started = time.perf_counter()
        loss_sum, correct, count, step, lr = train_epoch(epoch, step)
        elapsed = time.perf_counter() - started
        total_loss, total_correct, total_count, elapsed_sum = summed(
            [loss_sum, correct, count, elapsed], "train"
        )
        test_loss, test_accuracy = evaluate(model, dataset, rank, size)
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
                with writer.as_default():
                    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                        tf.summary.scalar(key, getattr(metrics, key), step=epoch + 1)
                    tf.summary.scalar("samples_per_sec", metrics.samples_per_sec, step=epoch + 1)
                    tf.summary.scalar("lr", lr, step=epoch + 1)
                writer.flush()
            if checkpoints is not None:
                checkpoints.save(epoch + 1, step)
    if writer is not None:
        writer.close()

    if history:
        test_loss, test_accuracy = history[-1].test_loss, history[-1].test_accuracy
    else:
        test_loss, test_accuracy = evaluate(model, dataset, rank, size)
    per_rank = hvd.allgather_object(
        {
            "hostname": host,
            "local_rank": local_rank,
            "device": choice.describe(),
            "initial_checksum": initial_checksum,
            "start_checksum": start_checksum,
            "checksum": weights_checksum(model),
            "epoch_orders": epoch_orders,
            "bn_checksum": batchnorm_checksum(model),
        },
        name="rank_summary",
    )
    weights = [np.asarray(w, dtype=np.float64) for w in model.trainable_weights]
    result = run_summary(
        framework="tensorflow",
        mode=config.mode,
        dataset=dataset.name,
        size=size,
        config=config,
        start_epoch=start_epoch,
        resumed_from=resumed_from,
        history=history,
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        per_rank=per_rank,
        param_sq_norm=float(sum(np.sum(w * w) for w in weights)),
    )
    result["keras_version"] = keras_version()
    result["amp"] = {
        "enabled": config.amp,
        "policy": policy,
        "forward_dtype": forward_dtype(model, dataset.x_test),
        "loss_scaling": isinstance(
            getattr(model, "optimizer", None) or optimizer,
            keras.mixed_precision.LossScaleOptimizer,
        ),
    }
    result["batchnorm_layer"] = next(
        (type(layer).__name__ for layer in model.layers if "BatchNorm" in type(layer).__name__),
        None,
    )
    if rank == 0:
        emit(contract.result_line(result))
    return result


EpochFn = Callable[[int, int], tuple[float, float, float, int, float]]


def _allreduce_max(value: float) -> float:
    return float(hvd.allreduce(tf.constant([value]), op=hvd.Max, name="stop_request")[0])


def _stop_with_checkpoint(checkpoints: Any, rank: int, epoch: int, step: int) -> None:
    """Every rank, at the agreed step: rank 0 saves (`epoch` epochs done, and the
    step within the next), all wait for it, all stop."""
    error = None
    where = "no --checkpoint-dir: nothing saved"
    if rank == 0 and checkpoints is not None:
        try:
            checkpoints.save(epoch, step)
            where = f"checkpoint {checkpoints.manager.latest_checkpoint}"
        except (OSError, tf.errors.OpError) as exc:
            error = f"SIGTERM: cannot write the checkpoint: {exc}"
    agree_on_error(hvd, error)  # a collective: nobody leaves before rank 0 saved
    raise Preempted(f"stopped on SIGTERM at epoch {epoch + 1}, step {step}; {where}")


def _tape_epochs(
    config: TrainConfig,
    model: Any,
    optimizer: Any,
    dataset: Dataset,
    size: int,
    rank: int,
    data_seed: int,
    steps: int,
    on_step: Callable[[int, int], None] = lambda epoch, step: None,
    skip: tuple[int, int] = (0, 0),
) -> EpochFn:
    """A custom loop: gradients averaged by hvd.DistributedGradientTape. `on_step`
    runs after every step (the agreed look at SIGTERM); `skip` is (epoch, batches)
    already done before the checkpoint a resumed run starts from."""
    on_gpu = bool(tf.config.get_visible_devices("GPU"))
    scale = lr_scale(size, hvd.local_size(), config.adasum, on_gpu)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step_fn(images: Any, labels: Any) -> tuple[Any, Any]:
        scaling = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)
            target = optimizer.get_scaled_loss(loss) if scaling else loss
        tape = hvd.DistributedGradientTape(
            tape,
            op=hvd.Adasum if config.adasum else hvd.Average,
            compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
            gradient_predivide_factor=config.gradient_predivide_factor,
        )
        gradients = tape.gradient(target, model.trainable_variables)
        if scaling:
            # Unscaled after the allreduce: every rank sees the same inf/NaN and
            # skips the same steps.
            gradients = optimizer.get_unscaled_gradients(gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss, logits

    train_step = tf.function(step_fn, reduce_retracing=True)

    def train_epoch(epoch: int, step: int) -> tuple[float, float, float, int, float]:
        loss_sum = correct = count = 0.0
        lr = learning_rate(step, steps, config.lr, scale, config.warmup_epochs)
        batches = epoch_dataset(dataset, size, rank, data_seed, epoch, config.batch_size)
        if epoch == skip[0] and skip[1]:
            batches = batches.skip(skip[1])  # done before the preemption resumed from
        for images, labels in batches:
            lr = learning_rate(step, steps, config.lr, scale, config.warmup_epochs)
            optimizer.learning_rate.assign(lr)
            loss, logits = train_step(images, labels)
            n = int(labels.shape[0])
            loss_sum += float(loss) * n
            correct += float(np.sum(np.argmax(logits.numpy(), axis=1) == labels.numpy()))
            count += n
            step += 1
            on_step(epoch, step)
        return loss_sum, correct, count, step, lr

    return train_epoch


# tf.keras is reached through an attribute: a name mypy can take as a base class.
_KerasCallback: Any = keras.callbacks.Callback


class StepLearningRate(_KerasCallback):  # type: ignore[misc]
    """Sets the learning rate before every batch of model.fit from the global step
    (common.learning_rate), so fit and the custom loop follow one schedule."""

    def __init__(
        self, optimizer: Any, steps: int, base_lr: float, size: int, warmup_epochs: float
    ) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.steps = steps
        self.base_lr = base_lr
        self.size = size
        self.warmup_epochs = warmup_epochs
        self.epoch = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        step = self.epoch * self.steps + batch
        lr = learning_rate(step, self.steps, self.base_lr, self.size, self.warmup_epochs)
        keras.backend.set_value(self.optimizer.learning_rate, lr)


class ReportProgress(_KerasCallback):  # type: ignore[misc]
    """Rank 0's HVJOB_PROGRESS line from model.fit's batches (horovod_contract.progress)."""

    def __init__(self, progress: ProgressReporter, steps: int, samples_per_step: int) -> None:
        super().__init__()
        self.progress, self.steps, self.samples_per_step = progress, steps, samples_per_step
        self.epoch = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        step = self.epoch * self.steps + batch + 1
        self.progress.step(step, epoch=self.epoch, samples=step * self.samples_per_step)


def _fit_epochs(
    config: TrainConfig,
    model: Any,
    optimizer: Any,
    dataset: Dataset,
    size: int,
    rank: int,
    data_seed: int,
    steps: int,
    progress: ProgressReporter,
) -> EpochFn:
    """Keras model.fit, one call per epoch (each with its own shard order).

    horovod.tensorflow.keras does the distributed work: DistributedOptimizer
    averages gradients, BroadcastGlobalVariablesCallback re-broadcasts after
    the first batch (a no-op here: the explicit broadcast already ran),
    MetricAverageCallback averages the logged metrics. The learning rate follows
    the same per-step schedule as the custom loop (common.learning_rate), set
    before every batch: Horovod's LearningRateWarmupCallback checks the warm-up's
    end only at epoch boundaries, so a fractional --warmup-epochs kept ramping
    past --lr x size until the epoch ended (25-75% too high).
    """
    on_gpu = bool(tf.config.get_visible_devices("GPU"))
    scale = lr_scale(size, hvd.local_size(), config.adasum, on_gpu)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    schedule = StepLearningRate(optimizer, steps, config.lr, scale, config.warmup_epochs)
    reporting = ReportProgress(progress, steps, config.batch_size * size)
    callbacks = [
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd_keras.callbacks.MetricAverageCallback(),
        schedule,
        reporting,
    ]

    def train_epoch(epoch: int, step: int) -> tuple[float, float, float, int, float]:
        schedule.epoch = reporting.epoch = epoch
        data = epoch_dataset(dataset, size, rank, data_seed, epoch, config.batch_size)
        fitted = model.fit(
            data,
            initial_epoch=epoch,
            epochs=epoch + 1,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=0,
        )
        # MetricAverageCallback already averaged these over ranks; turn them back
        # into per-rank sums so that the caller's allreduce gives the global mean.
        per_rank = steps * config.batch_size
        count = float(min(per_rank, len(dataset.y_train) // size))
        loss = float(fitted.history["loss"][-1])
        accuracy = float(fitted.history["accuracy"][-1])
        lr = float(keras.backend.get_value(optimizer.learning_rate))
        return loss * count, accuracy * count, count, step + steps, lr

    return train_epoch
