"""Train a small classifier with Horovod: ``python -m horovod_worker.train``.

Start one process per GPU (or per CPU slot) with horovodrun, mpirun, or the
operator's launcher; every process runs this same command.

Example:
    horovodrun -np 2 -H localhost:2 --gloo \\
        python -m horovod_worker.train --framework pytorch --epochs 3
"""

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import horovod_contract as contract
from horovod_worker.arguments import non_negative_float, positive_float, positive_int
from horovod_worker.common import TrainConfig, WorkerError, error_exit
from horovod_worker.data import DATASETS, DataError, mnist_paths
from horovod_worker.preemption import EXIT_PREEMPTED, Preempted

FRAMEWORKS = ("pytorch", "tensorflow")
AMP_DTYPES = ("auto", "float16", "bfloat16")
MODES = ("tape", "fit")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (every rank prints it)."""

    def error(self, message: str) -> NoReturn:
        sys.exit(error_exit(f"{message} (see --help)", status=2, prog=self.prog))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="horovod_worker.train",
        description=(
            "Train a small image classifier data-parallel with Horovod. Run the same "
            "command in every process (horovodrun -np N ...). Each process pins the GPU "
            "numbered by its local rank (or the CPU when none is visible), reads its "
            "shard of the data, and averages gradients with the others. Rank 0 prints "
            f"progress, writes checkpoints and logs, and ends with one line "
            f"'{contract.RESULT_PREFIX} {{json}}'."
        ),
        epilog=(
            f"Environment: {contract.ENV_EXPECTED_SIZE}=N makes every process fail unless "
            "hvd.size() == N (catches ranks that did not join one world). "
            "TF_USE_LEGACY_KERAS is set to 1: horovod.tensorflow.keras needs tf-keras."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="pytorch",
        help="deep learning framework: pytorch (hvd.DistributedOptimizer) or tensorflow",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="tape",
        help="TensorFlow only: 'tape' is a custom loop with hvd.DistributedGradientTape; "
        "'fit' is Keras model.fit with horovod.tensorflow.keras callbacks",
    )
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="digits",
        help="digits: scikit-learn's bundled 8x8 digits (no download); mnist: the four "
        "MNIST IDX files in --data-dir (never downloaded); synthetic: random data for "
        "throughput; imagefolder: --data-dir/train/<class>/<image> (and test/ or val/); "
        "csv: --data-dir/train.csv (and test.csv) with a 'label' column",
    )
    parser.add_argument(
        "--image-size",
        type=positive_int,
        default=32,
        help="--dataset imagefolder: images are resized to this side (RGB)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="directory of --dataset mnist, imagefolder or csv (a mounted volume)",
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=3, help="total epochs (a resumed run included)"
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=32,
        help="samples per step per process; the global batch is this times the world size",
    )
    parser.add_argument(
        "--lr",
        type=positive_float,
        default=0.05,
        help="learning rate of one process; scaled by the world size after warm-up",
    )
    parser.add_argument("--momentum", type=non_negative_float, default=0.9, help="SGD momentum")
    parser.add_argument(
        "--warmup-epochs",
        type=non_negative_float,
        default=1.0,
        help="epochs over which the learning rate ramps linearly from --lr to --lr x size",
    )
    parser.add_argument(
        "--hidden", type=positive_int, default=128, help="units of the hidden layer"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=42,
        help="seed of the model's initial weights; rank 0's seed also orders the data "
        "(its weights are broadcast to all ranks before the first step)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help="rank 0 writes a checkpoint here after every epoch (none when unset)",
    )
    parser.add_argument(
        "--log-dir", type=Path, help="rank 0 writes TensorBoard event files here (none when unset)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir (a fresh start when "
        "there is none); the result equals an uninterrupted run",
    )
    parser.add_argument(
        "--synthetic-samples",
        type=positive_int,
        default=4096,
        help="number of samples of --dataset synthetic",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads per process (default: the cores this container may use, by its "
        "affinity and CPU limit, divided by the local processes)",
    )
    performance = parser.add_argument_group("Horovod performance options")
    performance.add_argument(
        "--fp16-allreduce",
        action="store_true",
        help="compress gradients to float16 for the allreduce (half the traffic)",
    )
    performance.add_argument(
        "--adasum",
        action="store_true",
        help="combine gradients with Adasum instead of averaging; the learning rate is then "
        "not scaled by the world size (by the local size on GPUs)",
    )
    performance.add_argument(
        "--backward-passes-per-step",
        type=positive_int,
        default=1,
        help="accumulate gradients over N batches, one allreduce and update per N (PyTorch; "
        "TensorFlow --mode fit)",
    )
    performance.add_argument(
        "--gradient-predivide-factor",
        type=positive_float,
        default=1.0,
        help="divide gradients by F before the allreduce and by size/F after (overflow "
        "headroom for fp16; not with --adasum)",
    )
    precision = parser.add_argument_group("Mixed precision and batch normalization")
    precision.add_argument(
        "--amp",
        action="store_true",
        help="automatic mixed precision: the forward pass in a 16-bit type (PyTorch "
        "torch.autocast with a GradScaler; TensorFlow a mixed_* Keras policy with a "
        "LossScaleOptimizer for float16)",
    )
    precision.add_argument(
        "--amp-dtype",
        choices=AMP_DTYPES,
        default="auto",
        help="the 16-bit type of --amp: auto is float16 on GPUs (with loss scaling) and "
        "bfloat16 on CPUs (CPUs have no fast float16; bfloat16 needs no loss scaling)",
    )
    precision.add_argument(
        "--clip-grad-norm",
        type=positive_float,
        help="PyTorch: clip the averaged, unscaled gradients to this global norm",
    )
    precision.add_argument(
        "--batchnorm",
        action="store_true",
        help="add a batch-normalization layer after the hidden layer (statistics of "
        "each rank's own batch)",
    )
    precision.add_argument(
        "--sync-batchnorm",
        action="store_true",
        help="batch normalization over the global batch: statistics allreduced over all "
        "ranks (implies --batchnorm; hvd.SyncBatchNorm on GPUs, "
        "hvd.SyncBatchNormalization in TensorFlow)",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="train on the CPU even when the pod asked for GPUs and none is visible "
        "(default: fail, naming the missing device plugin or runtime)",
    )
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse and validate the command line; exits 2 with one line on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir")
    if args.dataset == "mnist" and args.data_dir is None:
        parser.error("--dataset mnist needs --data-dir (MNIST is never downloaded)")
    if args.dataset in ("imagefolder", "csv") and args.data_dir is None:
        parser.error(f"--dataset {args.dataset} needs --data-dir")
    if args.mode == "fit" and args.framework != "tensorflow":
        parser.error("--mode fit is the Keras path: use it with --framework tensorflow")
    if args.adasum and args.mode == "fit":
        parser.error(
            "--adasum: horovod.tensorflow.keras's DistributedOptimizer supports only "
            "averaging; use --mode tape"
        )
    if args.adasum and args.gradient_predivide_factor != 1.0:
        parser.error("--gradient-predivide-factor applies to averaging, not to --adasum")
    if args.backward_passes_per_step > 1 and args.framework == "tensorflow" and args.mode != "fit":
        parser.error(
            "--backward-passes-per-step needs --mode fit with TensorFlow "
            "(hvd.DistributedGradientTape has no accumulation)"
        )
    if args.amp_dtype != "auto" and not args.amp:
        parser.error("--amp-dtype needs --amp")
    if args.clip_grad_norm is not None and args.framework != "pytorch":
        parser.error("--clip-grad-norm is implemented for --framework pytorch")
    return TrainConfig(
        framework=args.framework,
        mode=args.mode,
        dataset=args.dataset,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        warmup_epochs=args.warmup_epochs,
        hidden=args.hidden,
        seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        log_dir=args.log_dir,
        data_dir=args.data_dir,
        resume=args.resume,
        synthetic_samples=args.synthetic_samples,
        image_size=args.image_size,
        threads=args.threads,
        allow_cpu=args.allow_cpu,
        fp16_allreduce=args.fp16_allreduce,
        adasum=args.adasum,
        backward_passes_per_step=args.backward_passes_per_step,
        gradient_predivide_factor=args.gradient_predivide_factor,
        amp=args.amp,
        amp_dtype=args.amp_dtype,
        clip_grad_norm=args.clip_grad_norm,
        batchnorm=args.batchnorm or args.sync_batchnorm,
        sync_batchnorm=args.sync_batchnorm,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    try:
        # Before any framework import: a missing file fails in a second, not after
        # importing TensorFlow, and on every rank (each checks its own host).
        if config.dataset == "mnist" and config.data_dir is not None:
            mnist_paths(config.data_dir)
        data_dir = config.data_dir
        if config.dataset in ("imagefolder", "csv") and data_dir and not data_dir.is_dir():
            raise DataError(f"--data-dir {data_dir} does not exist")
        # Horovod sets HOROVOD_ELASTIC=1 for the ranks of an elastic run (an elastic
        # HorovodJob, or horovodrun --min-np/--max-np): the loop that survives resets.
        elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
        if config.framework == "pytorch" and elastic:
            from horovod_worker import torch_elastic

            torch_elastic.run(config)
        elif config.framework == "pytorch":
            from horovod_worker import torch_trainer

            torch_trainer.run(config)
        else:
            # horovod.tensorflow.keras works with tf-keras only (Keras 3 ranks
            # silently diverge in fit); TensorFlow reads this at import.
            os.environ["TF_USE_LEGACY_KERAS"] = "1"
            if elastic:
                from horovod_worker import tf_elastic

                tf_elastic.run(config)
            else:
                from horovod_worker import tf_trainer

                tf_trainer.run(config)
    except Preempted as exc:
        # Every rank stopped at the same step, rank 0's checkpoint is on disk.
        print(f"horovod_worker.train: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_PREEMPTED)
    except (WorkerError, DataError) as exc:
        status = error_exit(str(exc))
        if "horovod.common.basics" in sys.modules:
            # Horovod is running: its exit-time shutdown would wait for ranks
            # that may be gone. Leave now, like MPI_Abort (output is flushed).
            sys.stdout.flush()
            os._exit(status)
        return status
    except ImportError as exc:
        return error_exit(
            f"{exc}: install the worker with hack/install-worker.sh "
            f"(torch, tensorflow-cpu/tf-keras and Horovod)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
