"""Waiting on a condition with a deadline, instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    within_s: float = 5.0,
    every_s: float = 0.01,
    what: str = "the condition",
) -> None:
    """Return as soon as `condition()` (a function or a coroutine function) is true; fail the
    test, naming `what`, when it is still false after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within_s:g} s")
        await asyncio.sleep(every_s)
