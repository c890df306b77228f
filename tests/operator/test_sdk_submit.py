"""`hvjob submit`'s pure part: a script becomes a ConfigMap and a HorovodJob the
operator accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from horovod_operator.api import parse_job
from horovod_operator.sdk import SubmitError, script_job
from horovod_operator.sdk.submit import SCRIPT_DIR, owned_by


def test_a_script_becomes_a_configmap_mounted_into_every_worker(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    configmap, job = script_job("train", script, ["--epochs", "3"], workers=4, gpus=2)
    assert configmap["data"] == {"train.py": "print('hi')\n"}
    assert configmap["metadata"]["name"] == "train-script"
    parsed = parse_job({**job, "metadata": {"name": "train"}}, default_image="img")
    assert parsed.spec.command == ["python", f"{SCRIPT_DIR}/train.py", "--epochs", "3"]
    assert parsed.spec.worker.replicas == 4
    assert parsed.spec.slots_per_worker == 2, "one rank per GPU"
    assert parsed.spec.worker.resources is not None
    assert parsed.spec.worker.resources.gpus() == 2
    template = job["spec"]["worker"]["template"]["spec"]
    assert template["volumes"][0]["configMap"]["name"] == "train-script"
    assert template["containers"][0]["volumeMounts"][0]["mountPath"] == SCRIPT_DIR


def test_cpu_jobs_get_one_rank_per_worker_unless_told(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    assert script_job("t", script, [])[1]["spec"]["slotsPerWorker"] == 1
    assert script_job("t", script, [], slots=3)[1]["spec"]["slotsPerWorker"] == 3
    assert "resources" not in script_job("t", script, [])[1]["spec"]["worker"]


@pytest.mark.parametrize(
    ("setup", "kwargs", "message"),
    [
        ("missing", {}, "no such file"),
        ("big", {}, "ConfigMap holds under 1 MiB"),
        ("ok", {"gpus": 1, "slots": 2}, "each rank needs its GPU"),
    ],
)
def test_refusals_say_what_to_change(
    tmp_path: Path, setup: str, kwargs: dict[str, int], message: str
) -> None:
    script = tmp_path / "train.py"
    if setup == "big":
        script.write_text("#" * (1024 * 1024))
    elif setup == "ok":
        script.write_text("")
    with pytest.raises(SubmitError, match=message):
        script_job("train", script, [], gpus=kwargs.get("gpus", 0), slots=kwargs.get("slots"))


def test_the_script_belongs_to_its_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    configmap, _ = script_job("train", script, [])
    created = {"metadata": {"name": "train", "uid": "u-1"}}
    owned = owned_by(configmap, created)
    assert owned["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert "ownerReferences" not in configmap["metadata"]


def test_a_refused_script_configmap_takes_its_job_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from horovod_operator.sdk import JobError, cli

    deleted: list[str] = []

    class RefusingClient:
        namespace = "ns"

        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def create(self, manifest: dict[str, object]) -> dict[str, object]:
            return {"metadata": {"name": "train", "uid": "u-1"}}

        def create_configmap(self, configmap: object) -> None:
            raise JobError("creating ConfigMap 'train-script': 403 exceeded quota")

        def delete(self, name: str) -> None:
            deleted.append(name)

    monkeypatch.setattr(cli, "HorovodJobClient", RefusingClient)
    script = tmp_path / "train.py"
    script.write_text("")
    assert cli.main(["submit", str(script)]) == 1
    assert deleted == ["train"]
