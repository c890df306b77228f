"""What a test needs of the machine: skipped on a developer's, required under CI."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def available(present: bool, reason: str) -> bool:
    """Whether an optional part of a test can run: on a developer's machine a missing
    prerequisite only leaves that part out (the caller says so); under CI, where
    hack/bootstrap.sh installs every prerequisite, a missing one is a failure."""
    if not present and os.environ.get("CI"):
        pytest.fail(f"CI must have this: {reason}")
    return present


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer's machine; fail it
    under CI."""
    available(False, reason)
    pytest.skip(reason)


def require_module(name: str) -> ModuleType:
    """The module, for a test module that needs it at import time (torch, horovod):
    without it (a worker-less bootstrap, SKIP_WORKER=1) the whole module is skipped
    on a developer's machine, and under CI its collection fails."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        reason = f"{name} is not installed ({error}); hack/bootstrap.sh without SKIP_WORKER=1"
        if os.environ.get("CI"):
            pytest.fail(f"CI must have this: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
