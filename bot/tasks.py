"""asyncio task helpers that every layer may use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


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


class Resumed:
    """A coroutine that has already taken its first step (and yielded what it waits for), as
    an awaitable that goes on from there: what a task can run."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        waiting = self.waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                self.coro.close()
                raise
            except BaseException as err:  # noqa: BLE001 - thrown in: the coroutine's to handle
                try:
                    waiting = self.coro.throw(err)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting = self.coro.send(sent)
                except StopIteration as done:
                    return done.value
