"""Process helpers shared by test modules."""

import os
import signal
import subprocess
from typing import Any

import pytest


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer's machine; under CI,
    where hack/bootstrap.sh installs every prerequisite, a missing one is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must have this: {reason}")
    pytest.skip(reason)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15) -> None:
    """SIGTERM a process the tests started, SIGKILL it if it outlives `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
