"""Real multi-process Horovod training on the CPU (marker ``training``).

These tests need Horovod built into the venv (hack/install-worker.sh). Without
it the folder is skipped with the reason, except under CI (CI set): there a
missing Horovod is a failure, so that a broken install cannot pass as green.
"""

from pathlib import Path
from typing import Any

import pytest
from testsupport import skip_unless_ci
from training_helpers import horovod_missing

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.training)


@pytest.fixture(autouse=True, scope="session")
def _require_horovod() -> None:
    reason = horovod_missing()
    if reason is None:
        return
    skip_unless_ci(reason)
