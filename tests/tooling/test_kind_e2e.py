"""The kind e2e script's helpers: CPU variants of the examples, the timings it reads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.paths import REPO
from tests.e2e.kind import kind_e2e


def test_cpu_variant_drops_gpus_sets_the_image_and_shortens_training() -> None:
    job: dict[str, Any] = {
        "metadata": {"name": "j"},
        "spec": {
            "image": "horovod-worker:0.1.0",
            "command": ["python", "-m", "horovod_worker.train", "--epochs=30"],
            "worker": {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}},
        },
    }
    variant = kind_e2e.cpu_variant(job, "horovod-worker:e2e", epochs=1)
    assert variant["spec"] == {
        "image": "horovod-worker:e2e",
        "command": ["python", "-m", "horovod_worker.train", "--epochs=1"],
        "worker": {"replicas": 2},
    }
    assert job["spec"]["worker"]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_cpu_variant_keeps_other_resources() -> None:
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "image": "i",
            "command": ["x"],
            "worker": {"resources": {"limits": {"nvidia.com/gpu": 2, "memory": "4Gi"}}},
        },
    }
    variant = kind_e2e.cpu_variant(job, "img")
    assert variant["spec"]["worker"]["resources"] == {"limits": {"memory": "4Gi"}}


def test_examples_expect_success_unless_annotated() -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        job = kind_e2e.horovod_job(list(yaml.safe_load_all(path.read_text())))
        assert kind_e2e.expected_phase(job) in ("Succeeded", "Failed"), path
    assert kind_e2e.expected_phase({"metadata": {}}) == "Succeeded"
    failing = {"metadata": {"annotations": {kind_e2e.EXPECT_ANNOTATION: "Failed"}}}
    assert kind_e2e.expected_phase(failing) == "Failed"


def test_failing_variant_refuses_its_dataset_on_every_rank_without_retry() -> None:
    job = yaml.safe_load((REPO / "examples" / "pytorch-digits.yaml").read_text())
    variant = kind_e2e.failing_variant(job, "horovod-worker:e2e")
    assert variant["metadata"]["name"] == "pytorch-digits-refused-argument"
    assert kind_e2e.expected_phase(variant) == "Failed"
    assert "--dataset=no-such-dataset" in variant["spec"]["command"]
    assert variant["spec"]["runPolicy"]["backoffLimit"] == 0
    assert "nvidia.com/gpu" not in yaml.safe_dump(variant)


def test_status_text_gathers_message_conditions_and_failures() -> None:
    status = {
        "message": "m",
        "conditions": [{"type": "Failed", "message": "c"}],
        "failures": [{"pod": "p", "message": "invalid choice: 'no-such-dataset'"}],
    }
    assert "no-such-dataset" in kind_e2e.status_text(status)
    assert kind_e2e.status_text({}) == ""


def test_kubernetes_timestamps_with_nanoseconds_parse() -> None:
    stamp = kind_e2e._parse_time("2026-12-01T07:30:01.123456789Z")
    created = kind_e2e._parse_time("2026-12-01T07:30:00Z")
    assert (stamp - created).total_seconds() == 1.123456


def test_a_claim_gets_a_volume_bound_ahead_and_other_documents_none() -> None:
    documents = list(
        yaml.safe_load_all((REPO / "examples" / "pytorch-digits-pvc.yaml").read_text())
    )
    [volume] = kind_e2e.volumes_for_claims(documents, "standard")
    spec = volume["spec"]
    assert spec["claimRef"] == {"namespace": "default", "name": "pytorch-digits-checkpoints"}
    assert spec["storageClassName"] == "standard" and spec["accessModes"] == ["ReadWriteMany"]
    assert spec["hostPath"]["path"].startswith(kind_e2e.VOLUME_ROOT)
    own_script = REPO / "examples" / "pytorch-own-script.yaml"
    assert kind_e2e.volumes_for_claims(list(yaml.safe_load_all(own_script.read_text())), "x") == []


def test_the_rank_line_kept_while_running_times_a_job_whose_pods_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An elastic job's workers hold its rank lines; cleanPodPolicy Running deletes
    those still up when it finishes, so wait() keeps the line as soon as it shows."""
    job = {
        "metadata": {"name": "j", "creationTimestamp": "2026-12-02T10:00:00Z"},
        "spec": {"elastic": {"maxReplicas": 2}},
        "status": {"phase": "Running"},
    }
    logs = {"pod/j-worker-1": "2026-12-02T10:00:07.400000000Z [1]<stdout>:HVJOB_RANK rank=1 size=2"}

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        target = args[3] if args[0] == "logs" else ""
        return subprocess.CompletedProcess(args, 0, stdout=logs.get(target, ""), stderr="")

    def get_job(name: str, namespace: str) -> dict[str, Any]:
        return job

    monkeypatch.setattr(kind_e2e, "_kubectl", kubectl)
    kept = tmp_path / "j.rank-line"
    rank0 = "2026-12-02T10:00:09.300000000Z [0]<stdout>:HVJOB_RANK rank=0 size=2"

    def job_then_rank0(name: str, namespace: str) -> dict[str, Any]:
        # Rank 1's line came first; the lines are read again until rank 0's shows.
        if kept.exists():
            logs["pod/j-worker-1"] += "\n" + rank0
            monkeypatch.setattr(kind_e2e, "get_job", lambda n, ns: next(calls))
        return job

    calls = iter([job, {**job, "status": {"phase": "Succeeded"}}])
    monkeypatch.setattr(kind_e2e, "get_job", job_then_rank0)
    assert kind_e2e.wait("j", "default", "Succeeded", timeout=10, interval=0, rank_line=kept)
    assert kept.read_text().startswith("2026-12-02T10:00:07.4")
    assert rank0 in kept.read_text()

    logs.clear()  # the pods are gone
    monkeypatch.setattr(kind_e2e, "get_job", get_job)
    assert "apply_to_trainers_started_s" not in kind_e2e.timings("j", "default")
    times = kind_e2e.timings("j", "default", kept)
    assert times["apply_to_trainers_started_s"] == 7.4
    assert times["apply_to_rank0_started_s"] == 9.3

    # Rank 0's pod gone, another worker's still there (CI's run of b7c3a58): its
    # lines lack rank 0's, and the kept ones time the job.
    logs["pod/j-worker-1"] = "2026-12-02T10:00:08.100000000Z [1]<stdout>:HVJOB_RANK rank=1 size=2"
    assert "apply_to_rank0_started_s" not in kind_e2e.timings("j", "default")
    times = kind_e2e.timings("j", "default", kept)
    assert times["apply_to_trainers_started_s"] == 7.4
    assert times["apply_to_rank0_started_s"] == 9.3
