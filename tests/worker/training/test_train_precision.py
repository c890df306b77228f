"""--amp and --sync-batchnorm under horovodrun (Gloo, 2 CPU ranks): each takes
effect, and every rank still ends with the same parameters.

Batch-norm running statistics are buffers the optimizer never averages: each
rank's follow its own shard, unless --sync-batchnorm computes them over the
global batch. So they differ between ranks with --batchnorm and are equal with
--sync-batchnorm -- the observable proof that synchronization happened.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.training import horovodrun

COMMON = ["--dataset=digits", "--batch-size=32", "--lr=0.05", "--epochs=1", "--seed=7"]
COMMON += ["--warmup-epochs=0"]


def _run(framework: str, *extra: str, mode: str = "") -> dict[str, Any]:
    args = [f"--framework={framework}", *COMMON, *extra, *([f"--mode={mode}"] if mode else [])]
    run = horovodrun(args, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    assert len(set(result["param_checksums"])) == 1, result["param_checksums"]
    return result


@pytest.fixture(scope="module")
def torch_baseline() -> dict[str, Any]:
    return _run("pytorch")


def test_torch_amp_on_cpu_autocasts_to_bfloat16_without_loss_scaling(
    torch_baseline: dict[str, Any],
) -> None:
    assert torch_baseline["amp"]["forward_dtype"] == "float32"
    amp = _run("pytorch", "--amp")
    assert amp["amp"]["autocast_dtype"] == "bfloat16"
    assert amp["amp"]["forward_dtype"] == "bfloat16"  # the model really ran in bfloat16
    assert amp["amp"]["loss_scaling"] is False
    # Reduced precision changed the numbers, not the training.
    assert amp["param_checksums"][0] != torch_baseline["param_checksums"][0]
    assert amp["param_sq_norm"] == pytest.approx(torch_baseline["param_sq_norm"], rel=5e-2)
    assert amp["test_accuracy"] == pytest.approx(torch_baseline["test_accuracy"], abs=0.1)


def test_torch_float16_amp_runs_horovods_grad_scaler_pattern(
    torch_baseline: dict[str, Any],
) -> None:
    # float16 (the GPU default) forced on the CPU: the GradScaler with
    # optimizer.synchronize() / unscale_ / clip / skip_synchronize() / step.
    amp = _run("pytorch", "--amp", "--amp-dtype=float16", "--clip-grad-norm=0.5")
    assert amp["amp"]["forward_dtype"] == "float16"
    assert amp["amp"]["loss_scaling"] is True
    assert amp["amp"]["final_loss_scale"] >= 1.0
    assert amp["optimizer_updates"] == torch_baseline["optimizer_updates"]
    assert amp["param_checksums"][0] != torch_baseline["param_checksums"][0]
    assert amp["test_accuracy"] == pytest.approx(torch_baseline["test_accuracy"], abs=0.1)


def test_torch_sync_batchnorm_makes_batch_statistics_global() -> None:
    local = _run("pytorch", "--batchnorm")
    synced = _run("pytorch", "--sync-batchnorm")
    assert local["batchnorm_layer"] == "BatchNorm1d"
    assert synced["batchnorm_layer"] == "CpuSyncBatchNorm"  # hvd.SyncBatchNorm on GPUs
    # Different shards: per-rank statistics differ, global ones are equal.
    assert len(set(local["bn_stat_checksums"])) == 2, local["bn_stat_checksums"]
    assert len(set(synced["bn_stat_checksums"])) == 1, synced["bn_stat_checksums"]
    assert synced["bn_stat_checksums"][0] is not None
    assert synced["param_checksums"][0] != local["param_checksums"][0]
    assert synced["test_accuracy"] > 0.85


def test_torch_amp_and_sync_batchnorm_together() -> None:
    both = _run("pytorch", "--amp", "--sync-batchnorm")
    assert both["amp"]["forward_dtype"] == "bfloat16"
    assert len(set(both["bn_stat_checksums"])) == 1


def test_tensorflow_tape_mixed_bfloat16_and_sync_batchnorm() -> None:
    local = _run("tensorflow", "--batchnorm", mode="tape")
    synced = _run("tensorflow", "--amp", "--sync-batchnorm", mode="tape")
    assert local["amp"]["forward_dtype"] == "float32"
    assert synced["amp"]["policy"] == "mixed_bfloat16"
    assert synced["amp"]["forward_dtype"] == "bfloat16"
    assert synced["batchnorm_layer"] == "SyncBatchNormalization"
    assert len(set(local["bn_stat_checksums"])) == 2, local["bn_stat_checksums"]
    assert len(set(synced["bn_stat_checksums"])) == 1, synced["bn_stat_checksums"]


def test_keras_fit_mixed_float16_scales_the_loss() -> None:
    amp = _run("tensorflow", "--amp", "--amp-dtype=float16", mode="fit")
    assert amp["amp"]["policy"] == "mixed_float16"
    assert amp["amp"]["forward_dtype"] == "float16"
    assert amp["amp"]["loss_scaling"] is True  # model.compile wrapped the optimizer
    assert amp["test_accuracy"] > 0.8


def test_cpu_sync_batchnorm_equals_batchnorm_over_the_whole_batch() -> None:
    # Each of 2 ranks normalizes its half; the result must be what one BatchNorm1d
    # computes over the whole batch: outputs, running statistics and gradients.
    run = horovodrun([], module="tests.support.sync_bn_check", timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    assert result["size"] == 2
    for key, error in result["max_errors"].items():
        assert error < 1e-9, (key, result["max_errors"])
