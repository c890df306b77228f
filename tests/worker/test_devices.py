"""Device selection by local rank, with simulated lists of visible GPUs."""

from pathlib import Path

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


def test_a_pod_that_asked_for_gpus_and_sees_none_refuses_the_cpu() -> None:
    from horovod_worker.devices import select_for_pod

    asked = {"HVJOB_GPUS_PER_WORKER": "2", "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(DeviceError, match=r"asked for 2 GPU\(s\).*--allow-cpu"):
        select_for_pod(0, 1, [], environ=asked)
    assert not select_for_pod(0, 1, [], allow_cpu=True, environ=asked).is_gpu
    pretend = {**asked, "HVJOB_ALLOW_CPU": "1"}
    assert not select_for_pod(0, 1, [], environ=pretend).is_gpu
    # Nothing asked for: the CPU is the plan.
    assert not select_for_pod(0, 1, [], environ={}).is_gpu
    assert select_for_pod(1, 2, ["A", "B"], environ=asked).gpu_index == 1


def test_threads_follow_the_cgroup_cpu_limit(tmp_path: Path) -> None:
    from horovod_worker.devices import cgroup_cpu_limit, default_threads

    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == 4.0
    # 64 cores visible, a 2.5-CPU limit, 2 ranks: 3 usable cores shared -> 1 each.
    assert default_threads(2, cpu_limit=2.5, cores=64) == 1
    assert default_threads(2, cpu_limit=None, cores=64) == 32
    assert default_threads(4, cpu_limit=0.5, cores=2) == 1
