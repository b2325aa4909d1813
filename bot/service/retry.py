"""The one retry policy of the Telegram side: exponential backoff with a cap and jitter,
Telegram's retry_after honoured, every wait cut short by a stop (SIGTERM/SIGINT).

`retry()` runs a call until it succeeds, on tenacity (a well-kept library, instead of a
hand-written `attempt += 1; log; sleep` loop in every module).
"""

from __future__ import annotations

import asyncio
import logging
import random
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from telegram.error import RetryAfter
from telegram.warnings import PTBDeprecationWarning
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    retry_if_not_exception_type,
)

from bot.tasks import cancel_and_wait

T = TypeVar("T")
log = logging.getLogger(__name__)


class Interrupted(Exception):
    """A stop (SIGTERM/SIGINT) came while a start-up step was still waiting or retrying."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and a little jitter, so retries of many chats spread out."""

    initial_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 30.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        base = min(self.cap_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return base * (1.0 + random.uniform(0.0, self.jitter))

    async def sleep(self, attempt: int, stop: asyncio.Event | None = None) -> bool:
        """Wait before retry number `attempt`; False, at once, if `stop` is set first."""
        return await pause(self.delay(attempt), stop)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` at most `timeout_s` seconds; True if it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def pause(seconds: float, stop: asyncio.Event | None = None) -> bool:
    """Sleep `seconds`; False, at once, if `stop` is set first (or was already)."""
    if stop is None:
        await asyncio.sleep(seconds)
        return True
    return not await wait_event(stop, seconds)


async def unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event | None) -> T:
    """Await `awaitable`, unless `stop` is set first: then cancel it and raise Interrupted."""
    if stop is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            await cancel_and_wait(task, raise_errors=False)
    if task.cancelled() or not task.done():
        raise Interrupted
    return task.result()


def retry_after_s(err: RetryAfter) -> float:
    """Seconds a 429 asks us to wait (PTB 22 warns that the attribute becomes a timedelta)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = err.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    on: tuple[type[BaseException], ...] = (Exception,),
    never: tuple[type[BaseException], ...] = (),
    stop: asyncio.Event | None = None,
    finish_call: bool = False,
    logger: logging.Logger = log,
) -> T:
    """`await call()` until it succeeds, retrying the exceptions in `on` (and 429s) but not
    those in `never`.

    Waits `backoff.delay(attempt)` between tries, or what a 429 asks for; logs each failure
    as "<what> failed (<error>); retry <n>" at WARNING (without a traceback). When `stop` is
    set it raises Interrupted at once, cancelling a call in progress too unless `finish_call`
    (a database write that should complete). Anything else propagates unchanged.
    """

    def wait(state: RetryCallState) -> float:
        err = state.outcome.exception() if state.outcome is not None else None
        if isinstance(err, RetryAfter):
            return retry_after_s(err)
        return backoff.delay(state.attempt_number)

    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        logger.warning("%s failed (%s); retry %d", what, err, state.attempt_number)

    async def sleep(seconds: float) -> None:
        if not await pause(seconds, stop):
            raise Interrupted(what)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type((*on, RetryAfter))
        & retry_if_not_exception_type((*never, Interrupted)),
        wait=wait,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await (call() if finish_call else unless_stopped(call(), stop))
    raise AssertionError("unreachable: tenacity retries until success or an exception")
