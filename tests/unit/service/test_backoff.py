"""The Telegram side's one retry policy (bot/service/retry.py): the delay sequence, its cap and
jitter, Telegram's retry_after, and a stop that cuts every wait (and a call) short."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import timedelta

import pytest
from telegram.error import RetryAfter

from bot.service.retry import (
    Backoff,
    Interrupted,
    pause,
    retry,
    retry_after_s,
    unless_stopped,
    wait_event,
)

QUICK = Backoff(initial_s=0.01, factor=2.0, cap_s=0.04, jitter=0.0)


class Flaky:
    """A call that fails with `errors`, one per try, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _stop_in(seconds: float) -> asyncio.Event:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    return stop


# --- the delays --------------------------------------------------------------------------


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    backoff = Backoff(initial_s=0.5, factor=2.0, cap_s=3.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert backoff.delay(0) == 0.5  # attempts count from 1; nothing shorter than initial_s
    assert Backoff().delay(1) >= 0.5 and Backoff().delay(100) <= 30.0 * 1.1


def test_jitter_only_lengthens_and_by_at_most_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff(initial_s=1.0, factor=2.0, cap_s=5.0, jitter=0.1)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert base <= min(delays) and max(delays) <= base * 1.1
        assert len(set(delays)) > 100  # really random: many chats' retries spread out
    # The extremes of the jitter, exactly.
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    assert backoff.delay(4) == pytest.approx(5.5)
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    assert backoff.delay(4) == 5.0


# --- waiting, and a stop -----------------------------------------------------------------


async def test_pause_sleeps_the_time_without_a_stop() -> None:
    started = time.monotonic()
    assert await pause(0.05) is True
    assert await pause(0.05, asyncio.Event()) is True
    assert time.monotonic() - started >= 0.1


async def test_a_stop_ends_a_pause_at_once() -> None:
    started = time.monotonic()
    assert await pause(30, _stop_in(0.05)) is False
    stopped = asyncio.Event()
    stopped.set()
    assert await pause(30, stopped) is False  # already set: no wait at all
    assert await Backoff(initial_s=30).sleep(1, stopped) is False
    assert time.monotonic() - started < 5


async def test_backoff_sleep_waits_its_delay() -> None:
    started = time.monotonic()
    assert await Backoff(initial_s=0.05, jitter=0.0).sleep(2) is True  # 0.05 * 2
    assert time.monotonic() - started >= 0.1


async def test_wait_event_says_whether_the_event_came() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, 0) is True


async def test_unless_stopped_returns_the_result_or_cancels_the_call() -> None:
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    assert await unless_stopped(answer(), None) == 42
    assert await unless_stopped(answer(), asyncio.Event()) == 42

    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(Interrupted):
        await unless_stopped(forever(), _stop_in(0.05))
    assert cancelled.is_set() and time.monotonic() - started < 5


# --- retry -------------------------------------------------------------------------------


def test_retry_after_is_read_in_seconds() -> None:
    assert retry_after_s(RetryAfter(5)) == 5.0
    assert retry_after_s(RetryAfter(timedelta(seconds=1.5))) == 1.5


async def test_retry_until_it_succeeds_logging_each_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = Flaky(ConnectionError("refused"), TimeoutError("slow"))
    logger = logging.getLogger("test.backoff")
    with caplog.at_level(logging.WARNING, logger="test.backoff"):
        assert await retry(call, what="getMe", backoff=QUICK, logger=logger) == "ok"
    assert call.calls == 3
    assert [r.getMessage() for r in caplog.records] == [
        "getMe failed (refused); retry 1",
        "getMe failed (slow); retry 2",
    ]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback per retry


async def test_retry_waits_the_backoff_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float, stop: asyncio.Event | None = None) -> bool:
        waits.append(seconds)
        return True

    monkeypatch.setattr("bot.service.retry.pause", no_sleep)
    backoff = Backoff(initial_s=1.0, factor=3.0, cap_s=5.0, jitter=0.0)
    call = Flaky(*(OSError(str(n)) for n in range(4)))
    assert await retry(call, what="x", backoff=backoff) == "ok"
    assert waits == [1.0, 3.0, 5.0, 5.0]


async def test_a_429_waits_what_telegram_asks_even_when_not_in_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float, stop: asyncio.Event | None = None) -> bool:
        waits.append(seconds)
        return True

    monkeypatch.setattr("bot.service.retry.pause", no_sleep)
    call = Flaky(RetryAfter(7), RetryAfter(timedelta(seconds=2.5)))
    assert await retry(call, what="sendMessage", backoff=QUICK, on=(ValueError,)) == "ok"
    assert waits == [7.0, 2.5]


async def test_errors_not_retried_propagate_at_once() -> None:
    never = Flaky(PermissionError("forbidden"))
    with pytest.raises(PermissionError):
        await retry(never, what="x", backoff=QUICK, on=(OSError,), never=(PermissionError,))
    assert never.calls == 1  # PermissionError is an OSError, but `never` wins
    other = Flaky(KeyError("bug"))
    with pytest.raises(KeyError):
        await retry(other, what="x", backoff=QUICK, on=(OSError,))
    assert other.calls == 1


async def test_a_stop_interrupts_the_wait_between_tries() -> None:
    call = Flaky(*(OSError("down") for _ in range(100)))
    started = time.monotonic()
    with pytest.raises(Interrupted):
        await retry(call, what="x", backoff=Backoff(initial_s=30, jitter=0), stop=_stop_in(0.05))
    assert call.calls == 1 and time.monotonic() - started < 5


async def test_a_stop_cancels_the_call_in_progress_unless_it_must_finish() -> None:
    finished: list[bool] = []

    async def slow() -> str:
        await asyncio.sleep(0.3)
        finished.append(True)
        return "written"

    with pytest.raises(Interrupted):
        await retry(slow, what="x", backoff=QUICK, stop=_stop_in(0.05))
    assert finished == []
    # A database write completes even though the stop came during it.
    assert await retry(slow, what="x", backoff=QUICK, stop=_stop_in(0.05), finish_call=True) == (
        "written"
    )
    assert finished == [True]


async def test_retry_never_retries_its_own_interruption(caplog: pytest.LogCaptureFixture) -> None:
    # Found in review: with the default `on=(Exception,)`, the Interrupted raised for a call
    # cut short by the stop counted as a failure to retry ("... failed (); retry 1").
    stop = asyncio.Event()
    calls = 0

    async def slow() -> None:
        nonlocal calls
        calls += 1
        stop.set()
        await asyncio.sleep(10)

    caplog.set_level(logging.WARNING)
    with pytest.raises(Interrupted):
        await retry(slow, what="slow", backoff=Backoff(initial_s=0.01), stop=stop)
    assert calls == 1
    assert not [r for r in caplog.records if "retry" in r.getMessage()]
