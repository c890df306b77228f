"""The test suite's one set-up: the fixtures in tests/support/fixtures.py, and
markers from where a test lives (…/integration: the local control plane;
tests/e2e: whole jobs on the node agent; …/training: real horovodrun training;
…/images: container images built and run with Docker; `docker`: every test that
uses Docker, wherever it lives).

Tests mirror the code: tests/operator, tests/worker, tests/tooling (localcluster,
bench, the kind script), and tests/e2e across all three. `tests` is a package and
pytest puts the repository root on sys.path, so tests import `tests.support`,
`localcluster` and `bench` like any package.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.fixtures", "tests.support.docker"]

HERE = Path(__file__).resolve().parent
MARKERS = {
    "integration": pytest.mark.integration,
    "training": pytest.mark.training,
    "images": pytest.mark.images,
}


# hack/test.sh runs the suite as two pytest streams side by side (`-m stream_b` and
# `-m "not stream_b"`). Stream B takes what needs a control plane and node agent of
# its own (tests/e2e), every Docker test, and these training modules; stream A the
# unit and integration tests and the other training modules, which use the CPU the
# integration tests leave idle while they wait. Chosen from a measured run
# (docs/dev/ci-times.md) so that both streams take about as long.
TRAINING_IN_STREAM_B = {
    "test_benchmark.py",
    "test_elastic_discovery.py",
    "test_elastic_training.py",
    "test_example_script.py",
    "test_horovodrun_shim_build.py",
    "test_preemption.py",
    "test_train_data.py",
    "test_train_errors.py",
    "test_train_options.py",
    "test_train_precision.py",
    "test_train_pytorch.py",
    "test_train_tensorflow.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tests that use Docker run last, in their own order: their images are the
    # suite's longest builds, and .ci/run builds them beside the other tests
    # (hack/warm-up.sh) instead of before the tests that need none.
    items.sort(key=uses_docker)
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(HERE).parts
        if uses_docker(item):
            item.add_marker(pytest.mark.docker)
        if parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)
        for part in parts[:-1]:
            if part in MARKERS:
                item.add_marker(MARKERS[part])
        if in_stream_b(parts, uses_docker(item)):
            item.add_marker(pytest.mark.stream_b)


def in_stream_b(parts: tuple[str, ...], docker: bool) -> bool:
    """Whether hack/test.sh runs a test (by its path under tests/) in its second stream."""
    if docker or parts[0] == "e2e":
        return True
    return "training" in parts[:-1] and parts[-1] in TRAINING_IN_STREAM_B


def uses_docker(item: pytest.Item) -> bool:
    return "docker" in getattr(item, "fixturenames", ())
