"""localcluster/image_record.py: the key of the GPU images' inputs, and the record's use."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from localcluster import image_record
from localcluster.paths import REPO
from tests.worker.images.probe import NotRecorded, RecordedProbe, question


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git work tree with a file of every input, standing in for the repository."""
    for path in image_record.INPUTS:
        file = tmp_path / path
        if "." in Path(path).name:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(f"{path}\n")
        else:
            file.mkdir(parents=True, exist_ok=True)
            (file / "a.py").write_text("a = 1\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = "1.2.3"\n')
    (tmp_path / "README.md").write_text("not an input\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    monkeypatch.setattr(image_record, "REPO", tmp_path)
    monkeypatch.setattr(image_record, "RECORD", tmp_path / "tests/worker/images/gpu-record.json")
    return tmp_path


def test_every_input_changes_the_key_and_nothing_else_does(repo: Path) -> None:
    before = image_record.inputs_key("torch-gpu")
    assert image_record.inputs_key("tf-gpu") != before
    (repo / "README.md").write_text("changed\n")
    assert image_record.inputs_key("torch-gpu") == before
    for path in ("Dockerfile.worker", "worker/horovod_worker/a.py", "tests/worker/images/a.py"):
        file = repo / path
        original = file.read_text()
        file.write_text(original + "# changed\n")
        assert image_record.inputs_key("torch-gpu") != before, path
        file.write_text(original)
    assert image_record.inputs_key("torch-gpu") == before
    # A new file in an input folder (not yet committed) counts too.
    (repo / "hack/patches/new.patch").write_text("+x\n")
    assert image_record.inputs_key("torch-gpu") != before


def test_the_version_is_part_of_the_key(repo: Path) -> None:
    before = image_record.inputs_key("torch-gpu")
    (repo / "pyproject.toml").write_text('[project]\nversion = "1.2.4"\n')
    assert image_record.inputs_key("torch-gpu") != before


def test_a_record_applies_only_to_the_inputs_it_was_made_from(repo: Path) -> None:
    assert image_record.current("torch-gpu") is None
    entry = {
        "key": image_record.inputs_key("torch-gpu"),
        "recorded": "2026-12-07T06:00:00Z",
        "commit": "0" * 40,
        "answers": {question("inspect"): {"Config": {}, "Size": 1}},
    }
    image_record.write({"torch-gpu": entry})
    # Writing the record does not change the key (the record is not an input).
    assert image_record.current("torch-gpu") == entry
    assert image_record.current("tf-gpu") is None
    assert image_record.main(["check", "torch-gpu"]) == 0
    assert image_record.main(["check"]) == 1  # tf-gpu has none
    (repo / "hack/install-worker.sh").write_text("changed\n")
    assert image_record.current("torch-gpu") is None
    assert "stale" in image_record.describe("torch-gpu")
    assert image_record.main(["check", "torch-gpu"]) == 1
    assert json.loads(image_record.RECORD.read_text())["torch-gpu"]["commit"] == "0" * 40


def test_the_cli_refuses_a_cpu_target(repo: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        image_record.main(["check", "torch-cpu"])
    assert refused.value.code == 2


def test_a_question_the_record_does_not_hold_fails_and_names_the_fix() -> None:
    entry = {
        "key": "k" * 64,
        "recorded": "2026-12-07T06:00:00Z",
        "commit": "c" * 40,
        "answers": {
            question("run", ["true"], []): {"returncode": 0, "stdout": "", "stderr": ""},
            question("fatbin", "/x.so"): [["elf", 90]],
        },
    }
    probe = RecordedProbe("horovod-worker:1-torch-gpu", entry)
    assert probe.run("true").returncode == 0
    assert probe.fatbin("/x.so") == [["elf", 90]]
    assert "2026-12-07" in probe.source and "cccccccccccc" in probe.source
    with pytest.raises(NotRecorded, match="make record-gpu-images"):
        probe.run("false")
    with pytest.raises(NotRecorded):
        probe.run("true", options=("--user=0",))  # the options are part of the question


def test_every_file_the_worker_dockerfile_reads_from_the_context_is_an_input() -> None:
    """A file the build reads that the key leaves out would let a stale record stand
    (hack/install-frameworks.sh, bind-mounted into the frameworks' stages, once was)."""
    dockerfile = (REPO / "Dockerfile.worker").read_text()
    copied = re.findall(r"^COPY (?!--from)(\S+)", dockerfile, re.M)
    bound = []
    for options in re.findall(r"--mount=type=bind,(\S+)", dockerfile):
        fields = dict(field.split("=", 1) for field in options.split(","))
        if "from" not in fields:  # another stage's files, not the context's
            bound.append(fields["source"])
    # The host's Horovod wheels: only the CPU images' build stages mount them.
    cpu_only = {"hack/prebuilt-wheels"}
    read = {path.rstrip("/") for path in copied + bound} - cpu_only
    assert read, "no COPY or bind mount found: the pattern no longer matches the Dockerfile"

    def covered(path: str) -> bool:
        return any(path == i or path.startswith(i + "/") for i in image_record.INPUTS)

    assert sorted(p for p in read if not covered(p)) == []
