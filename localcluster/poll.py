"""The one way the tooling and the tests wait: poll an observable state, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    """A state never arrived. An AssertionError, so that pytest shows it as a failure."""


def wait_for(
    fn: Callable[[], T | None],
    timeout: float = 30,
    interval: float = 0.2,
    message: str = "condition",
    describe: Callable[[], str] | None = None,
    error: type[Exception] = Timeout,
) -> T:
    """Poll `fn` until it returns something truthy and return that. On timeout raise
    `error` (Timeout unless the caller has its own) naming `message`, the last value
    seen and, when given, `describe()` (a log tail, say). Exceptions from `fn`
    propagate: a poll that sees the state can never arrive fails at once."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            detail = f"\n{describe()}" if describe is not None else ""
            raise error(
                f"timed out after {timeout:.0f}s waiting for {message} (last: {last!r}){detail}"
            )
        time.sleep(interval)


def holds(
    fn: Callable[[], object],
    seconds: float,
    interval: float = 0.1,
    message: str = "condition",
    describe: Callable[[], str] | None = None,
) -> None:
    """Fail at the first sight of `fn()` falsy within `seconds`: a bounded check that a
    wrong effect does not follow a state the caller already waited for."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = fn()
        if not value:
            detail = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"{message} stopped holding: {value!r}{detail}")
        time.sleep(interval)
