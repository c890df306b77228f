"""horovod_worker.benchmark under horovodrun (Gloo, 2 CPU ranks), small setting:
a real torchvision ResNet-18 and a Keras ResNet-50 on synthetic images."""

from __future__ import annotations

import pytest

from tests.support.training import horovodrun

SMALL = ["--batch-size=4", "--warmup-batches=2", "--batches-per-iter=2", "--iters=3"]


@pytest.mark.parametrize(
    ("framework", "model", "size"),
    [("pytorch", "resnet18", 32), ("tensorflow", "resnet50", 32)],
)
def test_benchmark_reports_per_rank_total_and_efficiency(
    framework: str, model: str, size: int
) -> None:
    run = horovodrun(
        [f"--framework={framework}", f"--model={model}", f"--image-size={size}", *SMALL],
        module="horovod_worker.benchmark",
        timeout=400,
    )
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    assert result["benchmark"] == "synthetic" and result["model"] == model
    assert result["size"] == 2 and result["devices"] == ["cpu", "cpu"]
    rates = result["images_per_sec_per_rank"]
    assert len(rates) == 2 and all(rate > 0 for rate in rates)
    assert result["images_per_sec_total"] == pytest.approx(sum(rates))
    single = result["single_rank_images_per_sec"]
    assert single > 0
    assert result["scaling_efficiency"] == pytest.approx(sum(rates) / (2 * single))
    assert result["timed_batches"] == 6 and result["warmup_batches"] == 2
    # Only rank 0 reports the single-rank phase; every rank reports its own rate.
    assert any("single-rank phase" in line for line in run.rank_lines(0))
