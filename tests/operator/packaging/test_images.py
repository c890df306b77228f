"""hack/images.sh and the Dockerfiles, where no Docker engine is needed. The image
itself is built and run by tests/integration/test_operator_image.py."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from localcluster.paths import REPO
from tests.conftest import uses_docker

SCRIPT = REPO / "hack" / "images.sh"
DOCKERFILES = sorted(REPO.glob("Dockerfile.*"))


def images(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def versions_env() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (REPO / "hack" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    return dict(pairs)


def test_image_version_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert images("version").stdout.strip() == version
    # The label's default, for a plain `docker build` that passes no VERSION.
    for dockerfile in ("Dockerfile.operator", "Dockerfile.worker"):
        labels = re.findall(r"^ARG VERSION=(\S+)$", (REPO / dockerfile).read_text(), re.M)
        assert labels and set(labels) == {version}, dockerfile


def test_no_dockerfile_needs_a_frontend_image() -> None:
    # A `# syntax=` directive makes BuildKit pull docker/dockerfile before building.
    for dockerfile in DOCKERFILES:
        head = dockerfile.read_text().splitlines()
        assert not [line for line in head if re.match(r"#\s*syntax\s*=", line, re.I)], dockerfile


def test_froms_are_the_public_bases_with_arg_defaults_applied(tmp_path: Path) -> None:
    assert images("froms", "Dockerfile.operator").stdout.split() == ["debian:bookworm-slim"]
    # Every worker stage, builders and runtimes, starts from the same Debian.
    assert images("froms", "Dockerfile.worker").stdout.split() == ["debian:bookworm-slim"]
    # Stages and scratch are not bases; ARGs are per Dockerfile.
    first = tmp_path / "Dockerfile.a"
    first.write_text("ARG BASE=x:1\nFROM ${BASE} AS one\nFROM one\nFROM scratch\n")
    second = tmp_path / "Dockerfile.b"
    second.write_text("ARG BASE=y:2\nFROM --platform=linux/amd64 $BASE-slim\n")
    assert images("froms", str(first), str(second)).stdout.split() == ["x:1", "y:2-slim"]


def test_help_and_unknown_commands() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    shown = images("--help")
    assert shown.returncode == 0
    commands = (
        "engine",
        "engine-stop",
        "status",
        "bases",
        "froms",
        "operator",
        "worker",
        "prune",
        "version",
    )
    for command in commands:
        assert f"hack/images.sh {command}" in shown.stdout, command
    bad = images("bogus")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "[images] error: unknown command: bogus (see --help)"


def test_worker_targets_are_the_dockerfiles_final_stages() -> None:
    targets = images("worker-targets").stdout.split()
    assert targets == ["torch-cpu", "tf-cpu", "torch-gpu", "tf-gpu"]
    # The final stages: the ones that label an image.
    text = (REPO / "Dockerfile.worker").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$(?:(?!^FROM ).)*?image\.title=", text, re.M | re.S)
    assert sorted(stages) == sorted(targets), stages
    # An unknown target is refused before any daemon or base is needed.
    bad = images("worker", "torch-rocm")
    assert bad.returncode == 1
    assert "unknown worker target: torch-rocm" in bad.stderr


def test_prune_names_our_images_as_the_dockerfiles_label_them() -> None:
    """`prune` removes untagged images by their title label: the one each
    Dockerfile sets. A wrong KEEP is refused before any daemon is needed."""
    script = (REPO / "hack" / "images.sh").read_text()
    dockerfiles = "".join(
        (REPO / f"Dockerfile.{name}").read_text() for name in ("worker", "operator")
    )
    titles = set(re.findall(r"org\.opencontainers\.image\.title=\"([\w-]+)\"", dockerfiles))
    assert titles == {"horovod-worker", "horovod-operator"}, titles
    assert "for title in horovod-worker horovod-operator; do" in script
    bad = images("prune", "a while")
    assert bad.returncode == 1
    assert "prune: KEEP is a duration such as 90m or 24h, not 'a while'" in bad.stderr


def test_worker_build_args_default_to_the_pins() -> None:
    """A plain `docker build` builds what hack/images.sh builds: every ARG default
    in Dockerfile.worker equals its line in hack/versions.env, and every pin that
    hack/images.sh passes is an ARG of the Dockerfile."""
    pins = versions_env()
    text = (REPO / "Dockerfile.worker").read_text()
    defaults = re.findall(r"^ARG (\w+)=(\S+)$", text, re.M)
    passed = re.search(r"WORKER_PINS=\(([^)]*)\)", SCRIPT.read_text())
    assert passed is not None
    for name in passed.group(1).split():
        assert any(arg == name for arg, _ in defaults), f"{name} is no ARG of Dockerfile.worker"
    for name, value in defaults:
        if name in pins:
            assert value == pins[name], f"ARG {name}={value} but hack/versions.env has {pins[name]}"
        else:
            assert name in ("VERSION", "REVISION"), f"ARG {name} is not pinned in versions.env"


WARM = REPO / "hack" / "warm-up.sh"


def test_warm_up_builds_every_worker_target_and_refuses_unknown_arguments() -> None:
    shown = subprocess.run([str(WARM), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "lowest CPU" in shown.stdout, shown.stdout + shown.stderr
    bad = subprocess.run([str(WARM), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument: --bogus" in bad.stderr
    # Its loops over the worker targets (the kind node image goes between two of them).
    loops = re.findall(r"^\s*for target in (.+); do$", WARM.read_text(), re.M)
    assert loops, "hack/warm-up.sh lost its loops over the worker targets"
    built = sorted(target for loop in loops for target in loop.split())
    assert built == sorted(images("worker-targets").stdout.split())


def test_the_tests_that_use_docker_run_after_all_the_others(request: pytest.FixtureRequest) -> None:
    # tests/conftest.py's order, read off this very session: .ci/run builds the
    # images beside the tests that come first (hack/warm-up.sh).
    uses = [uses_docker(item) for item in request.session.items]
    assert uses == sorted(uses)
