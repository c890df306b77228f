"""The trainer's command line: defaults, validation, one-line errors."""

from pathlib import Path

import pytest

import horovod_contract as contract
from horovod_worker.common import WorkerError, check_expected_size
from horovod_worker.train import build_parser, main, parse_config


def test_defaults_train_pytorch_on_digits() -> None:
    config = parse_config([])
    assert (config.framework, config.dataset, config.mode) == ("pytorch", "digits", "tape")
    assert config.epochs >= 1 and config.batch_size >= 1 and config.lr > 0
    assert config.checkpoint_dir is None and config.log_dir is None and not config.resume


def test_every_option_of_the_issue_is_parsed() -> None:
    config = parse_config(
        [
            "--framework=tensorflow",
            "--mode=fit",
            "--dataset=mnist",
            "--data-dir=/data/mnist",
            "--epochs=5",
            "--batch-size=64",
            "--lr=0.1",
            "--checkpoint-dir=/ckpt",
            "--log-dir=/logs",
            "--resume",
            "--seed=7",
        ]
    )
    assert config.framework == "tensorflow" and config.mode == "fit"
    assert config.data_dir == Path("/data/mnist")
    assert (config.epochs, config.batch_size, config.lr, config.seed) == (5, 64, 0.1, 7)
    assert config.checkpoint_dir == Path("/ckpt") and config.log_dir == Path("/logs")
    assert config.resume


def test_help_explains_each_option() -> None:
    text = build_parser().format_help()
    for option in (
        "--framework",
        "--dataset",
        "--epochs",
        "--batch-size",
        "--lr",
        "--checkpoint-dir",
        "--log-dir",
        "--data-dir",
        "--resume",
        "--seed",
    ):
        assert option in text
    assert contract.RESULT_PREFIX in text
    assert contract.ENV_EXPECTED_SIZE in text


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--framework=mxnet"], "invalid choice: 'mxnet'"),
        (["--dataset=imagenet"], "invalid choice: 'imagenet'"),
        (["--batch-size=0"], "--batch-size: must be a positive integer, got 0"),
        (["--batch-size=-3"], "must be a positive integer, got -3"),
        (["--epochs=two"], "expected a positive integer, got 'two'"),
        (["--lr=0"], "--lr: must be a positive number"),
        (["--lr=nan"], "must be a positive number"),
        (["--momentum=-0.1"], "must be a number >= 0"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--dataset=mnist"], "--dataset mnist needs --data-dir"),
        (["--mode=fit"], "--mode fit is the Keras path"),
        (
            ["--framework=tensorflow", "--mode=fit", "--adasum"],
            "DistributedOptimizer supports only averaging",
        ),
        (["--adasum", "--gradient-predivide-factor=2"], "applies to averaging, not to --adasum"),
        (
            ["--framework=tensorflow", "--backward-passes-per-step=2"],
            "--backward-passes-per-step needs --mode fit",
        ),
        (["--backward-passes-per-step=0"], "must be a positive integer"),
        (["--amp-dtype=bfloat16"], "--amp-dtype needs --amp"),
        (["--amp", "--amp-dtype=float8"], "invalid choice: 'float8'"),
        (["--framework=tensorflow", "--clip-grad-norm=1"], "--clip-grad-norm is implemented"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("horovod_worker.train: error: ")
    assert fragment in err


def test_missing_mnist_files_fail_before_any_framework_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")
    status = main(["--dataset=mnist", f"--data-dir={tmp_path}"])
    assert status == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "MNIST files missing" in err
    assert "train-labels-idx1-ubyte" in err
    assert "t10k-images-idx3-ubyte" in err


def test_expected_size_unset_or_matching_passes() -> None:
    check_expected_size(2, {})
    check_expected_size(2, {contract.ENV_EXPECTED_SIZE: ""})
    check_expected_size(4, {contract.ENV_EXPECTED_SIZE: "4"})


def test_expected_size_mismatch_names_both_sizes_and_the_gloo_fix() -> None:
    with pytest.raises(WorkerError) as raised:
        check_expected_size(1, {contract.ENV_EXPECTED_SIZE: "2"})
    message = str(raised.value)
    assert "hvd.size() is 1" in message and f"{contract.ENV_EXPECTED_SIZE}=2" in message
    assert "HOROVOD_CONTROLLER=gloo" in message


def test_expected_size_must_be_an_integer() -> None:
    with pytest.raises(WorkerError, match="is not an integer"):
        check_expected_size(2, {contract.ENV_EXPECTED_SIZE: "two"})


def test_sync_batchnorm_implies_batchnorm_and_amp_defaults_to_auto() -> None:
    config = parse_config(["--sync-batchnorm", "--amp"])
    assert config.sync_batchnorm and config.batchnorm
    assert config.amp and config.amp_dtype == "auto" and config.clip_grad_norm is None
    assert not parse_config([]).amp and not parse_config([]).batchnorm
