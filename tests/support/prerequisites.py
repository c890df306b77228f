"""What a test needs of the machine: skipped on a developer's, required under CI."""

import os

import pytest


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer's machine; under CI,
    where hack/bootstrap.sh installs every prerequisite, a missing one is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must have this: {reason}")
    pytest.skip(reason)
