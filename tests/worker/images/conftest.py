"""The worker images (Dockerfile.worker), built once per session by hack/images.sh.

`worker_image(target)` builds horovod-worker:<version>-<target> the first time a
test asks for it (with Docker's build cache: cold on a fresh machine, seconds
when nothing changed) and returns what the tests read from it: its probe
(probe.py) answers their questions. A GPU image is a large build: the tests that
need one carry a long timeout.

The GPU images, on a machine that has not built them: when the record of
localcluster/image_record.py was made from exactly this tree's inputs and no
image of that name is here, their tests run on the record's answers instead of a
build (the session's summary says so). HVK_GPU_IMAGES chooses:

- `auto` (the default): the record where it applies, else a build;
- `build`: always build (a record is never used);
- `record`: build, and when every test of the session passed, write the record
  of the GPU images it asked (`make record-gpu-images`).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcluster import image_record
from localcluster.paths import REPO
from localcluster.versions import read_versions
from tests.support.docker import images
from tests.worker.images.probe import ImageProbe, LiveProbe, RecordedProbe

# The longest a build may take here (a cold GPU image on 2 cores is the longest).
BUILD_TIMEOUT = 3600
MODES = ("auto", "build", "record")
# Targets answered from the record in this session, for the summary.
ANSWERED_FROM_RECORD: dict[str, str] = {}


@dataclass
class WorkerImage:
    target: str
    name: str
    user: str
    labels: dict[str, str]
    env: dict[str, str]
    size: int
    probe: ImageProbe = field(repr=False)
    build_log: str = field(repr=False, default="")

    @property
    def framework(self) -> str:
        return "pytorch" if self.target.startswith("torch") else "tensorflow"

    @property
    def gpu(self) -> bool:
        return self.target.endswith("-gpu")

    @property
    def cc_list(self) -> list[int]:
        """The compute capabilities Horovod's CUDA kernels were built for (versions.env)."""
        key = "HOROVOD_CUDA13_CC_LIST" if self.framework == "pytorch" else "HOROVOD_CUDA12_CC_LIST"
        return [int(cc) for cc in read_versions()[key].split(",")]


def gpu_images_mode() -> str:
    mode = os.environ.get("HVK_GPU_IMAGES", "auto")
    if mode not in MODES:
        raise pytest.UsageError(f"HVK_GPU_IMAGES={mode}: expected one of {', '.join(MODES)}")
    return mode


def image_present(docker: str, name: str) -> bool:
    done = subprocess.run([docker, "image", "inspect", name], capture_output=True, text=True)
    return done.returncode == 0


def from_probe(target: str, probe: ImageProbe, build_log: str = "") -> WorkerImage:
    inspected: dict[str, Any] = probe.inspect()
    config = inspected["Config"]
    return WorkerImage(
        target=target,
        name=probe.name,
        user=config["User"],
        labels=config["Labels"] or {},
        env=dict(item.split("=", 1) for item in config.get("Env") or []),
        size=int(inspected["Size"]),
        probe=probe,
        build_log=build_log,
    )


@pytest.fixture(scope="session")
def worker_image(
    docker: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], WorkerImage]]:
    mode = gpu_images_mode()
    built: dict[str, WorkerImage] = {}
    recording: dict[str, LiveProbe] = {}
    scratch = tmp_path_factory.mktemp("image-files")
    version = images("version").stdout.strip()

    def get(target: str) -> WorkerImage:
        if target in built:
            return built[target]
        name = f"horovod-worker:{version}-{target}"
        gpu = target in image_record.GPU_TARGETS
        entry = image_record.current(target) if gpu and mode == "auto" else None
        if entry is not None and not image_present(docker, name):
            probe = RecordedProbe(name, entry)
            ANSWERED_FROM_RECORD[target] = probe.source
            print(f"{name}: not built here; the tests read {probe.source}")
            built[target] = from_probe(target, probe)
            return built[target]
        done = images("worker", target, timeout=BUILD_TIMEOUT)
        assert done.returncode == 0, (
            f"hack/images.sh worker {target} failed:\n{done.stderr[-6000:]}"
        )
        live = LiveProbe(docker, name, scratch / target, recording=gpu and mode == "record")
        if live.answers is not None:
            recording[target] = live
        built[target] = from_probe(target, live, done.stderr)
        took = re.search(r"built \S+ in (\d+)s", done.stderr)
        print(f"{name}: {took.group(1) if took else '?'} s to build, {built[target].size} B")
        return built[target]

    yield get

    if recording:
        write_record(request.session, recording)


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Recording runs the GPU images' tests only (the CPU images have no record)."""
    if gpu_images_mode() != "record":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        target = params.params.get("target") if params is not None else None
        here = HERE in Path(str(item.path)).resolve().parents
        (drop if here and target not in image_record.GPU_TARGETS else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


SKIPPED: list[str] = []  # the tests of this folder skipped in this session


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and HERE in Path(report.fspath).resolve().parents:
        SKIPPED.append(report.nodeid)


def whole_folder(config: pytest.Config) -> bool:
    """Whether the session ran every test of this folder: a record made by a narrower
    selection would lack the answers of the tests left out."""
    if config.option.keyword or config.option.markexpr:
        return False
    paths = [Path(str(arg).split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(
        "::" not in str(arg) and (path == HERE or path in HERE.parents)
        for arg, path in zip(config.args, paths, strict=True)
    )


def write_record(session: pytest.Session, recording: dict[str, LiveProbe]) -> None:
    """The GPU images' answers, kept only when every test of this folder ran and passed."""
    if session.testsfailed:
        print(f"HVK_GPU_IMAGES=record: {session.testsfailed} test(s) failed, no record written")
        return
    if not whole_folder(session.config) or SKIPPED:
        print(
            "HVK_GPU_IMAGES=record: not every test of tests/worker/images ran "
            f"(skipped: {SKIPPED or 'none'}), no record written"
        )
        return
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *image_record.INPUTS],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries = {
        target: {
            "key": image_record.inputs_key(target),
            "recorded": now,
            "commit": commit + ("+changes" if dirty else ""),
            "answers": probe.answers,
        }
        for target, probe in recording.items()
    }
    image_record.write(entries)
    print(f"wrote {Path(image_record.RECORD).relative_to(REPO)}: {', '.join(entries)}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for target, source in ANSWERED_FROM_RECORD.items():
        terminalreporter.write_line(
            f"worker image {target}: not built on this machine; its tests read {source} "
            "(localcluster/image_record.py)"
        )
