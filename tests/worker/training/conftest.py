"""Real multi-process Horovod training on the CPU (marker ``training``).

These tests need Horovod built into the venv (hack/install-worker.sh). Without
it the folder is skipped with the reason, except under CI (CI set): there a
missing Horovod is a failure, so that a broken install cannot pass as green.
"""

import pytest

from tests.support.prerequisites import skip_unless_ci
from tests.support.training import horovod_missing


@pytest.fixture(autouse=True, scope="session")
def _require_horovod() -> None:
    reason = horovod_missing()
    if reason is None:
        return
    skip_unless_ci(reason)
