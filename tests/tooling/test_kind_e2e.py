"""The kind e2e script's pure helpers: CPU variants of the examples."""

from __future__ import annotations

from typing import Any

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
        job = yaml.safe_load(path.read_text())
        assert kind_e2e.expected_phase(job) in ("Succeeded", "Failed"), path
    assert kind_e2e.expected_phase({"metadata": {}}) == "Succeeded"
    failing = {"metadata": {"annotations": {kind_e2e.EXPECT_ANNOTATION: "Failed"}}}
    assert kind_e2e.expected_phase(failing) == "Failed"
