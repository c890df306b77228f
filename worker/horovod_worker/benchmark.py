"""Synthetic-data throughput of a real model under Horovod: ``python -m horovod_worker.benchmark``.

Like Horovod's own pytorch_synthetic_benchmark.py / tensorflow2_synthetic_benchmark.py
(ResNet-50 on random images, warm-up batches excluded, images/s per rank), plus
the scaling efficiency measured inside the same job:

1. Single-rank phase: rank 0 trains alone, with the framework's plain optimizer
   (no allreduce at all), while the other ranks wait in a broadcast. Its rate is
   what one process of this job achieves without Horovod's communication.
2. Distributed phase: every rank trains with hvd.DistributedOptimizer
   (DistributedGradientTape in TensorFlow), gradients averaged each step.

    efficiency = total images/s of phase 2 / (size x images/s of phase 1)

On GPUs each rank owns its device, so phase 1 is a fair one-GPU baseline. On
CPUs rank 0 runs phase 1 with the same thread count it has in phase 2 (its
share of the cores), so the figure measures communication and contention, not
the thread split. Rank 0 ends with one line ``HVJOB_RESULT {json}``, the same
contract as horovod_worker.train.

Example (the small CPU setting; the defaults are ResNet-50 at 224x224, batch 32):
    horovodrun -np 2 -H localhost:2 --gloo python -m horovod_worker.benchmark \\
        --model resnet18 --image-size 64 --batch-size 8 --allow-cpu
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import horovod_contract as contract
from horovod_worker.arguments import positive_int
from horovod_worker.common import WorkerError, emit, error_exit, hostname, log
from horovod_worker.devices import DeviceError, cgroup_cpu_limit, default_threads, select_for_pod

PROG = "horovod_worker.benchmark"
# Keras applications by the torchvision names they share.
KERAS_MODELS = {
    "resnet50": "ResNet50",
    "resnet101": "ResNet101",
    "resnet152": "ResNet152",
    "mobilenet_v2": "MobileNetV2",
    "efficientnet_b0": "EfficientNetB0",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.exit(error_exit(f"{message} (see --help)", status=2, prog=self.prog))


@dataclass(frozen=True)
class BenchConfig:
    framework: str
    model: str
    batch_size: int
    image_size: int
    num_classes: int
    warmup_batches: int
    batches_per_iter: int
    iters: int
    single_rank_phase: bool
    fp16_allreduce: bool
    amp: bool
    threads: int | None
    allow_cpu: bool


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Images/s of a real model on synthetic data, per rank and in total, with the "
            "scaling efficiency against a single-rank phase of the same job. Run the same "
            "command in every process (horovodrun -np N ...)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--framework", choices=("pytorch", "tensorflow"), default="pytorch")
    parser.add_argument(
        "--model",
        default="resnet50",
        help="a torchvision model name (resnet50, resnet18, ...) or, with tensorflow, one "
        f"of {', '.join(KERAS_MODELS)} (Keras applications)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per rank")
    parser.add_argument(
        "--image-size", type=positive_int, default=224, help="side of the square images"
    )
    parser.add_argument("--num-classes", type=positive_int, default=1000)
    parser.add_argument(
        "--warmup-batches",
        type=positive_int,
        default=10,
        help="batches run before timing in each phase (allocation, autotuning, caches)",
    )
    parser.add_argument(
        "--batches-per-iter", type=positive_int, default=10, help="batches per timed iteration"
    )
    parser.add_argument("--iters", type=positive_int, default=10, help="timed iterations")
    parser.add_argument(
        "--no-single-rank-phase",
        dest="single_rank_phase",
        action="store_false",
        help="skip phase 1 (no efficiency is reported)",
    )
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument(
        "--amp",
        action="store_true",
        help="autocast the forward pass (float16 on GPUs, bfloat16 on CPUs; PyTorch only)",
    )
    parser.add_argument("--threads", type=positive_int, help="CPU threads per process")
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run on the CPU even when the pod asked for GPUs and none is visible",
    )
    return parser


def parse_config(argv: Sequence[str] | None = None) -> BenchConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.framework == "tensorflow":
        if args.model not in KERAS_MODELS:
            parser.error(f"--model {args.model}: with tensorflow, one of {', '.join(KERAS_MODELS)}")
        if args.image_size < 32:
            parser.error("--image-size: Keras applications need at least 32")
        if args.amp:
            parser.error("--amp is implemented for --framework pytorch")
    return BenchConfig(
        framework=args.framework,
        model=args.model,
        batch_size=args.batch_size,
        image_size=args.image_size,
        num_classes=args.num_classes,
        warmup_batches=args.warmup_batches,
        batches_per_iter=args.batches_per_iter,
        iters=args.iters,
        single_rank_phase=args.single_rank_phase,
        fp16_allreduce=args.fp16_allreduce,
        amp=args.amp,
        threads=args.threads,
        allow_cpu=args.allow_cpu,
    )


@dataclass(frozen=True)
class PhaseResult:
    """Images/s of one rank in one phase: the mean over the timed iterations and
    the half-width of its 95% interval (1.96 standard deviations, as Horovod's
    benchmarks report)."""

    images_per_sec: float
    ci95: float
    iter_rates: list[float]


def time_phase(
    step: Callable[[], None], sync: Callable[[], None], config: BenchConfig
) -> PhaseResult:
    for _ in range(config.warmup_batches):
        step()
    sync()
    rates = []
    for _ in range(config.iters):
        started = time.perf_counter()
        for _ in range(config.batches_per_iter):
            step()
        sync()
        rates.append(config.batch_size * config.batches_per_iter / (time.perf_counter() - started))
    spread = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
    return PhaseResult(statistics.fmean(rates), spread, rates)


def summary(
    config: BenchConfig,
    size: int,
    per_rank: list[dict[str, Any]],
    single: PhaseResult | None,
) -> dict[str, Any]:
    """The result line's content (pure: unit-tested)."""
    rates = [float(r["images_per_sec"]) for r in per_rank]
    total = sum(rates)
    efficiency = total / (size * single.images_per_sec) if single is not None else None
    return {
        "benchmark": "synthetic",
        "framework": config.framework,
        "model": config.model,
        "image_size": config.image_size,
        "batch_size": config.batch_size,
        "global_batch_size": config.batch_size * size,
        "size": size,
        "devices": [r["device"] for r in per_rank],
        "hostnames": [r["hostname"] for r in per_rank],
        "threads": [r["threads"] for r in per_rank],
        "warmup_batches": config.warmup_batches,
        "timed_batches": config.batches_per_iter * config.iters,
        "images_per_sec_per_rank": rates,
        "ci95_per_rank": [float(r["ci95"]) for r in per_rank],
        "images_per_sec_mean_per_rank": total / size,
        "images_per_sec_total": total,
        "single_rank_images_per_sec": single.images_per_sec if single is not None else None,
        "single_rank_ci95": single.ci95 if single is not None else None,
        "scaling_efficiency": efficiency,
        "options": {"fp16_allreduce": config.fp16_allreduce, "amp": config.amp},
    }


def run_pytorch(config: BenchConfig) -> dict[str, Any]:
    import horovod.torch as hvd
    import torch
    import torchvision
    from torch import nn

    from horovod_worker.torch_layers import amp_dtype
    from horovod_worker.torch_trainer import pin_device, visible_gpus

    hvd.init()
    rank, size, local_size = hvd.rank(), hvd.size(), hvd.local_size()
    threads = config.threads or default_threads(local_size, cgroup_cpu_limit())
    torch.set_num_threads(threads)
    error = None
    try:
        choice = select_for_pod(hvd.local_rank(), local_size, visible_gpus(), config.allow_cpu)
        model = torchvision.models.get_model(
            config.model, weights=None, num_classes=config.num_classes
        )
    except (DeviceError, ValueError) as exc:
        error = str(exc)
    _agree(hvd, error)
    device = pin_device(choice)
    model = model.to(device)
    dtype = amp_dtype("auto", choice.is_gpu)
    torch.manual_seed(1234)
    images = torch.randn(config.batch_size, 3, config.image_size, config.image_size, device=device)
    labels = torch.randint(0, config.num_classes, (config.batch_size,), device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def make_step(optimizer: Any) -> Callable[[], None]:
        def step() -> None:
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=dtype, enabled=config.amp):
                output = model(images)
            loss = nn.functional.cross_entropy(output.float(), labels)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()

        return step

    describe = choice.describe()
    if rank == 0:
        log(
            rank,
            f"{config.model} {config.image_size}px batch {config.batch_size} on {describe}, "
            f"{threads} threads, {size} ranks",
        )
    single = None
    if config.single_rank_phase:
        # Before DistributedOptimizer exists: its backward hooks would start
        # allreduces that the waiting ranks never join.
        measured = None
        if rank == 0:
            plain = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            measured = time_phase(make_step(plain), sync, config)
            log(rank, f"single-rank phase: {measured.images_per_sec:.2f} img/s")
        single = hvd.broadcast_object(measured, root_rank=0, name="single_rank_phase")

    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if config.fp16_allreduce else hvd.Compression.none,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    mine = time_phase(make_step(optimizer), sync, config)
    return _finish(hvd, config, rank, size, mine, single, describe, threads)


def run_tensorflow(config: BenchConfig) -> dict[str, Any]:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from horovod_worker.tf_trainer import pin_device

    hvd.init()
    rank, size, local_size = hvd.rank(), hvd.size(), hvd.local_size()
    threads = config.threads or default_threads(local_size, cgroup_cpu_limit())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    error = None
    try:
        choice = pin_device(hvd.local_rank(), local_size, config.allow_cpu)
    except DeviceError as exc:
        error = str(exc)
    _agree(hvd, error)
    keras = tf.keras
    model = getattr(keras.applications, KERAS_MODELS[config.model])(
        weights=None,
        input_shape=(config.image_size, config.image_size, 3),
        classes=config.num_classes,
    )
    optimizer = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    rng = tf.random.Generator.from_seed(1234)
    images = rng.normal((config.batch_size, config.image_size, config.image_size, 3))
    labels = rng.uniform((config.batch_size,), maxval=config.num_classes, dtype=tf.int64)

    def make_step(distributed: bool) -> Callable[[], None]:
        def step_fn() -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(
                    tape,
                    compression=hvd.Compression.fp16
                    if config.fp16_allreduce
                    else hvd.Compression.none,
                )
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        train_step = tf.function(step_fn)

        def step() -> None:
            # .numpy() waits for the step: TensorFlow dispatches asynchronously.
            train_step().numpy()

        return step

    describe = choice.describe()
    single = None
    if config.single_rank_phase:
        measured = None
        if rank == 0:
            measured = time_phase(make_step(False), lambda: None, config)
            log(rank, f"single-rank phase: {measured.images_per_sec:.2f} img/s")
        single = hvd.broadcast_object(measured, root_rank=0, name="single_rank_phase")
    distributed_step = make_step(True)
    distributed_step()  # creates the optimizer's slots before they are broadcast
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables(), root_rank=0)
    mine = time_phase(distributed_step, lambda: None, config)
    return _finish(hvd, config, rank, size, mine, single, describe, threads)


def _agree(hvd: Any, error: str | None) -> None:
    from horovod_worker.common import agree_on_error

    agree_on_error(hvd, error)


def _finish(
    hvd: Any,
    config: BenchConfig,
    rank: int,
    size: int,
    mine: PhaseResult,
    single: PhaseResult | None,
    device: str,
    threads: int,
) -> dict[str, Any]:
    per_rank = hvd.allgather_object(
        {
            "images_per_sec": mine.images_per_sec,
            "ci95": mine.ci95,
            "device": device,
            "hostname": hostname(),
            "threads": threads,
        },
        name="bench_summary",
    )
    result = summary(config, size, per_rank, single)
    if rank == 0:
        efficiency = result["scaling_efficiency"]
        log(
            rank,
            f"total {result['images_per_sec_total']:.2f} img/s over {size} ranks"
            + ("" if efficiency is None else f", scaling efficiency {efficiency:.1%}"),
        )
        emit(contract.result_line(result))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    # Waiting ranks sit in a broadcast for the whole single-rank phase: no
    # "stalled ranks" warnings for that (a real stall still shows after 10 min).
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", "600")
    try:
        if config.framework == "pytorch":
            run_pytorch(config)
        else:
            run_tensorflow(config)
    except WorkerError as exc:
        status = error_exit(str(exc), prog=PROG)
        sys.stdout.flush()
        os._exit(status)
    except ImportError as exc:
        return error_exit(
            f"{exc}: install the worker with hack/install-worker.sh (torchvision for "
            "PyTorch models)",
            prog=PROG,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
