"""asyncio task helpers that every layer may use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


async def wait_ended(task: asyncio.Task[Any]) -> None:
    """Wait until `task` has ended, without cancelling it; raise the exception it ended with,
    if any (not its CancelledError).

    Not `await task`: that passes a cancellation of the caller on to the task, and a
    `suppress(CancelledError)` around it would then swallow the caller's own cancellation
    too. Here a cancellation of the caller (a deadline around a stop) ends the wait and goes
    on up, and the task goes on.
    """
    await asyncio.wait([task])
    if not task.cancelled() and (err := task.exception()) is not None:
        raise err


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, raise_errors: bool = True) -> None:
    """Cancel every task (None: there is none), then wait until all have ended.

    Their CancelledErrors are swallowed. Any other exception one ended with is raised once all
    have ended (the first, in the order given), or with `raise_errors=False` logged at debug
    level and dropped: for a task whose failure was reported where it happened. A cancellation
    of the caller itself (a deadline around a stop) ends the wait and goes on up, even for a
    task that does not end when cancelled.
    """
    live = [task for task in tasks if task is not None]
    if not live:
        return
    for task in live:
        task.cancel()
    # Not `await task`: see wait_ended (a task that drops a cancellation, as Python 3.11's
    # wait_for could, would otherwise hold the caller forever).
    await asyncio.wait(live)
    errors = [err for task in live if not task.cancelled() and (err := task.exception())]
    if errors and raise_errors:
        raise errors[0]
    for err in errors:
        log.debug("a task stopped with %s: %s", type(err).__name__, err)


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
