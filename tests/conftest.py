"""The test suite's one set-up: the fixtures in tests/support/fixtures.py, and
markers from where a test lives (…/integration: the local control plane;
tests/e2e: whole jobs on the node agent; …/training: real horovodrun training;
…/images: container images built and run with Docker).

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The tests that use Docker run last, in their own order: their images are the
    # suite's longest builds, and .ci/run builds them beside the other tests
    # (hack/warm-up.sh) instead of before the tests that need none.
    items.sort(key=uses_docker)
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(HERE).parts
        if parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)
        for part in parts[:-1]:
            if part in MARKERS:
                item.add_marker(MARKERS[part])


def uses_docker(item: pytest.Item) -> bool:
    return "docker" in getattr(item, "fixturenames", ())
