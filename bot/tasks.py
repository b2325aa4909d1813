"""asyncio task helpers that every layer may use."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None: there is none) and wait until it has ended, in order.

    Its CancelledError is swallowed; any other exception it ended with is raised. A
    cancellation of the caller itself (a deadline around a stop) ends the wait and goes on up,
    even for a task that does not end when cancelled.
    """
    for task in tasks:
        if task is None:
            continue
        task.cancel()
        # Not `await task`: that passes the caller's own cancellation on to the task, and a
        # task that drops it (Python 3.11's wait_for could) would hold the caller forever.
        await asyncio.wait([task])
        if not task.cancelled() and (err := task.exception()) is not None:
            raise err


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


def started(coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """`coro` with its first step taken now, in the caller's task, as Python 3.12's eager tasks
    take it: a coroutine that goes on from where it waits (or ends at once with its result or
    its error), for a task to run the rest."""
    try:
        waiting = coro.send(None)
    except StopIteration as done:
        return _returning(done.value)
    except Exception as err:  # noqa: BLE001 - raised where the rest runs, as a task would
        return _raising(err)
    return _going_on(Resumed(coro, waiting))


async def _returning(value: T) -> T:
    return value


async def _raising(err: Exception) -> Any:
    raise err


async def _going_on(rest: Resumed) -> Any:
    return await rest
