"""Every example is a valid HorovodJob (the integration tests also apply them)."""

from pathlib import Path

import pytest
import yaml

from horovod_operator.api import parse_job
from horovod_operator.builders import gloo_worker_command, launcher_command, new_worker_pod
from localcluster.paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Examples that need something the test clusters lack (storage): validated here,
# not run by the kind rung.
EXAMPLES += sorted((REPO / "examples").glob("*/*.yaml"))


def test_the_two_frameworks_and_gloo_have_examples() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"pytorch-digits.yaml", "tensorflow-digits.yaml", "pytorch-digits-gloo.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        if document.get("kind") != "HorovodJob":
            continue
        # PyTorch examples leave the image to the chart's workerImage (set per install,
        # so that users' registries work); others name their framework's GPU image.
        chart_default = yaml.safe_load(
            (REPO / "charts" / "horovod-operator" / "values.yaml").read_text()
        )["workerImage"]
        job = parse_job(document, default_image=chart_default)
        framework = "tf" if "--framework=tensorflow" in job.spec.command else "torch"
        if path.stem.endswith("-cpu"):
            # CPU examples name the CPU image and ask for no GPU.
            assert job.spec.image == f"horovod-worker:0.1.0-{framework}-cpu"
            assert job.spec.worker.resources is None or job.spec.worker.resources.gpus() is None
        else:
            assert job.spec.image == f"horovod-worker:0.1.0-{framework}-gpu"
            assert ("image" in document["spec"]) == (framework == "tf"), path.name
        if path.stem.endswith("-own-script"):
            # The script comes from the ConfigMap beside the job, mounted where it runs.
            script = next(
                d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "ConfigMap"
            )
            assert job.spec.worker.template is not None
            mount = job.spec.worker.template["spec"]["containers"][0]["volumeMounts"][0][
                "mountPath"
            ]
            assert job.spec.command[1] in {f"{mount}/{key}" for key in script["data"]}
        else:
            assert job.spec.command[:3] == ["python", "-m", "horovod_worker.train"]
        if job.spec.launch_mode == "gloo":
            # Each worker starts its own ranks; no horovodrun anywhere.
            assert gloo_worker_command(job.spec)[-len(job.spec.command) :] == job.spec.command
            continue
        command = launcher_command(job.spec)
        start = command.index("horovod_worker.horovodrun")
        assert command[start : start + 3] == [
            "horovod_worker.horovodrun", "-np", str(job.spec.total_slots()),
        ]  # fmt: skip


def test_pvc_example_mounts_its_claims_where_the_trainer_reads_and_writes() -> None:
    path = REPO / "examples" / "storage" / "pytorch-imagefolder-pvc.yaml"
    documents = list(yaml.safe_load_all(path.read_text()))
    claims = {d["metadata"]["name"] for d in documents if d["kind"] == "PersistentVolumeClaim"}
    (document,) = [d for d in documents if d["kind"] == "HorovodJob"]
    document["metadata"]["uid"] = "u"
    job = parse_job(document, default_image="horovod-worker:0.1.0-torch-gpu")
    pod = new_worker_pod(job, 0, 0)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    used = {
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes.values()
        if "persistentVolumeClaim" in v
    }
    assert used == claims
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True and mounts["/data"]["name"] in volumes
    assert mounts["/checkpoints"]["name"] in volumes and not mounts["/checkpoints"].get("readOnly")
    assert "--dataset=imagefolder" in job.spec.command and "--data-dir=/data" in job.spec.command
    checkpoint = next(a for a in job.spec.command if a.startswith("--checkpoint-dir="))
    assert checkpoint.split("=", 1)[1].startswith("/checkpoints/")
