"""Device selection by local rank, with simulated lists of visible GPUs."""

import pytest

from horovod_worker.devices import DeviceChoice, DeviceError, select_device

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    ("local_rank", "local_size", "gpus", "expected_index"),
    [
        (0, 1, [], None),
        (1, 2, [], None),
        (0, 1, [H100], 0),
        (0, 4, [H100] * 4, 0),
        (3, 4, [H100] * 4, 3),
        (1, 2, [H100] * 8, 1),
    ],
)
def test_each_local_rank_takes_its_own_gpu_or_the_cpu(
    local_rank: int, local_size: int, gpus: list[str], expected_index: int | None
) -> None:
    choice = select_device(local_rank, local_size, gpus)
    assert choice.gpu_index == expected_index
    assert choice.is_gpu == (expected_index is not None)


def test_no_gpu_falls_back_to_cpu_and_says_why() -> None:
    choice = select_device(0, 2, [], cuda_visible_devices="")
    assert choice == DeviceChoice(None, "", choice.reason)
    assert choice.describe() == "cpu"
    assert "no GPU visible" in choice.reason
    assert "CUDA_VISIBLE_DEVICES=''" in choice.reason


def test_gpu_choice_names_the_device() -> None:
    choice = select_device(1, 2, ["GPU-A", "GPU-B"], cuda_visible_devices="4,5")
    assert choice.describe() == "gpu:1 (GPU-B)"
    assert "local_rank 1 of 2" in choice.reason
    assert "'4,5'" in choice.reason


def test_processes_on_different_hosts_all_use_their_first_gpu() -> None:
    # One GPU per pod (slotsPerWorker 1): every process is local_rank 0 on its host.
    assert [select_device(0, 1, [H100]).gpu_index for _ in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(("local_size", "gpus"), [(2, 1), (4, 2), (8, 7)])
def test_too_few_gpus_is_an_error_naming_the_cause(local_size: int, gpus: int) -> None:
    with pytest.raises(DeviceError) as raised:
        select_device(0, local_size, [H100] * gpus, cuda_visible_devices="0")
    message = str(raised.value)
    assert f"{local_size} Horovod processes on this host" in message
    assert f"only {gpus} GPU(s) visible" in message
    assert "slotsPerWorker" in message
    assert "CUDA_VISIBLE_DEVICES='0'" in message


@pytest.mark.parametrize(("local_rank", "local_size"), [(-1, 1), (1, 1), (0, 0)])
def test_impossible_local_rank_is_rejected(local_rank: int, local_size: int) -> None:
    with pytest.raises(ValueError, match="not within local_size"):
        select_device(local_rank, local_size, [H100])
