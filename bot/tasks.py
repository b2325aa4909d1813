"""asyncio task helpers that every layer may use."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None: there is none) and wait until it has ended, in order.

    Its CancelledError is swallowed; any other exception it ended with is raised.
    """
    for task in tasks:
        if task is None:
            continue
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
