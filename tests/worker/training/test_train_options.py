"""Horovod's performance options under horovodrun (Gloo, 2 CPU ranks): each takes
effect, and every rank still ends with the same parameters."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.support.training import horovodrun

COMMON = ["--dataset=digits", "--batch-size=32", "--lr=0.05", "--epochs=1", "--seed=7"]
# No warm-up: the rate is the warmed-up one from the first step.
COMMON += ["--warmup-epochs=0"]


def _run(framework: str, *extra: str, mode: str = "", launch: str = "gloo") -> dict[str, Any]:
    args = [f"--framework={framework}", *COMMON, *extra, *([f"--mode={mode}"] if mode else [])]
    run = horovodrun(args, mode=launch, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    result = run.result()
    assert len(set(result["param_checksums"])) == 1, result["param_checksums"]
    return result


@pytest.fixture(scope="module")
def torch_baseline() -> dict[str, Any]:
    return _run("pytorch")


def test_fp16_compression_changes_the_numbers_only_slightly(torch_baseline: dict[str, Any]) -> None:
    fp16 = _run("pytorch", "--fp16-allreduce")
    assert fp16["options"]["fp16_allreduce"] is True
    # The gradients crossed the wire in float16: not bit-equal, but the same training.
    assert fp16["param_checksums"][0] != torch_baseline["param_checksums"][0]
    assert fp16["param_sq_norm"] == pytest.approx(torch_baseline["param_sq_norm"], rel=1e-2)


def test_adasum_changes_the_update_rule_and_does_not_scale_the_rate(
    torch_baseline: dict[str, Any],
) -> None:
    # Horovod has Adasum on its MPI controller only (a test below: refused under Gloo).
    adasum = _run("pytorch", "--adasum", launch="mpi")
    assert adasum["param_checksums"][0] != torch_baseline["param_checksums"][0]
    # Warmed up, the averaged run's rate is --lr x 2; Adasum's stays --lr on CPUs.
    assert torch_baseline["history"][-1]["lr"] == pytest.approx(0.1)
    assert adasum["history"][-1]["lr"] == pytest.approx(0.05)


def test_accumulation_halves_the_updates(torch_baseline: dict[str, Any]) -> None:
    accumulated = _run("pytorch", "--backward-passes-per-step=2")
    batches = torch_baseline["optimizer_updates"][0]
    assert torch_baseline["optimizer_updates"] == [batches, batches]
    assert accumulated["optimizer_updates"] == [math.ceil(batches / 2)] * 2
    assert accumulated["param_checksums"][0] != torch_baseline["param_checksums"][0]


def test_predivision_moves_the_division_not_the_result(torch_baseline: dict[str, Any]) -> None:
    predivided = _run("pytorch", "--gradient-predivide-factor=2")
    assert predivided["param_sq_norm"] == pytest.approx(torch_baseline["param_sq_norm"], rel=1e-5)


def test_tensorflow_tape_takes_fp16_and_adasum() -> None:
    base = _run("tensorflow", mode="tape")
    fp16 = _run("tensorflow", "--fp16-allreduce", mode="tape")
    adasum = _run("tensorflow", "--adasum", mode="tape", launch="mpi")
    assert fp16["param_checksums"][0] != base["param_checksums"][0]
    assert adasum["param_checksums"][0] != base["param_checksums"][0]
    assert adasum["history"][-1]["lr"] == pytest.approx(0.05)


def test_keras_fit_takes_fp16_and_accumulation() -> None:
    base = _run("tensorflow", mode="fit")
    fp16 = _run("tensorflow", "--fp16-allreduce", mode="fit")
    accumulated = _run("tensorflow", "--backward-passes-per-step=2", mode="fit")
    assert fp16["param_checksums"][0] != base["param_checksums"][0]
    assert accumulated["param_checksums"][0] != base["param_checksums"][0]


def test_options_that_do_not_combine_are_refused_on_every_rank() -> None:
    run = horovodrun(
        ["--framework=pytorch", *COMMON, "--adasum", "--gradient-predivide-factor=2"], timeout=120
    )
    assert run.returncode != 0
    assert "--gradient-predivide-factor applies to averaging" in run.output
    under_gloo = horovodrun(["--framework=pytorch", *COMMON, "--adasum"], timeout=180)
    assert under_gloo.returncode != 0
    for rank in range(2):
        assert any(
            "--adasum needs Horovod's MPI controller" in line
            for line in under_gloo.rank_lines(rank)
        ), under_gloo.output[-2000:]
