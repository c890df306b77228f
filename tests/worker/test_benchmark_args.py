"""horovod_worker.benchmark's command line and result (no Horovod needed)."""

import pytest

from horovod_worker.benchmark import PhaseResult, parse_config, summary


def test_defaults_are_horovods_resnet50_benchmark() -> None:
    config = parse_config([])
    assert (config.framework, config.model, config.image_size) == ("pytorch", "resnet50", 224)
    assert config.batch_size == 32 and config.warmup_batches == 10
    assert config.single_rank_phase


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--framework=tensorflow", "--model=resnet18"], "with tensorflow, one of resnet50"),
        (["--framework=tensorflow", "--image-size=16"], "at least 32"),
        (["--framework=tensorflow", "--amp"], "--amp is implemented for --framework pytorch"),
        (["--batch-size=0"], "must be a positive integer"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("horovod_worker.benchmark: error: ") and fragment in err


def _rank(rate: float) -> dict[str, object]:
    return {"images_per_sec": rate, "ci95": 0.5, "device": "cpu", "hostname": "h", "threads": 1}


def test_efficiency_is_total_over_size_times_the_single_rank_rate() -> None:
    config = parse_config(["--model=resnet18", "--batch-size=8"])
    single = PhaseResult(10.0, 0.2, [10.0])
    result = summary(config, 2, [_rank(9.0), _rank(8.0)], single)
    assert result["images_per_sec_total"] == 17.0
    assert result["images_per_sec_mean_per_rank"] == 8.5
    assert result["scaling_efficiency"] == pytest.approx(0.85)
    assert result["global_batch_size"] == 16
    no_baseline = summary(config, 2, [_rank(9.0), _rank(8.0)], None)
    assert no_baseline["scaling_efficiency"] is None
