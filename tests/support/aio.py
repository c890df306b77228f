"""localcluster.poll for tests that drive an asyncio loop themselves: the poll runs in
a thread, so the loop goes on running the code under test between two looks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from localcluster import poll

T = TypeVar("T")


async def wait_for(
    fn: Callable[[], T | None], timeout: float, message: str, interval: float = 0.01
) -> T:
    """poll.wait_for: until `fn()` is truthy; its value."""
    return await asyncio.to_thread(poll.wait_for, fn, timeout, interval, message)


async def holds(fn: Callable[[], object], seconds: float, message: str) -> None:
    """poll.holds: fail at the first sight of `fn()` falsy within `seconds`."""
    await asyncio.to_thread(poll.holds, fn, seconds, 0.01, message)
