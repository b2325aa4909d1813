"""bot/tasks.py: stopping a task, and a caller's own deadline around that."""

from __future__ import annotations

import asyncio

import pytest

from bot.tasks import cancel_and_wait, wait_ended


async def test_cancel_and_wait_swallows_the_tasks_cancellation_and_raises_its_error() -> None:
    sleeper = asyncio.create_task(asyncio.sleep(60))

    async def failing() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise ValueError("broke while stopping")

    await asyncio.sleep(0)
    await cancel_and_wait(sleeper, None)
    assert sleeper.cancelled()
    breaking = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broke while stopping"):
        await cancel_and_wait(breaking)


async def test_a_deadline_around_cancel_and_wait_still_ends_it() -> None:
    """A task that drops a cancellation (as Python 3.11's wait_for could) must not take its
    stopper's deadline with it: the caller's own cancellation ends the wait and goes on up."""
    asleep = asyncio.Event()
    dropped: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                asleep.set()
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped.append(1)  # the bug this guards against, elsewhere

    task = asyncio.create_task(stubborn())
    await asleep.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await cancel_and_wait(task)
    assert dropped == [1] and not task.done()
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_every_task_is_stopped_before_an_error_is_raised() -> None:
    """One task's error must not leave the next one running; raise_errors=False drops it."""

    async def failing() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            raise ValueError("broke while stopping")

    first, second = asyncio.create_task(failing()), asyncio.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broke while stopping"):
        await cancel_and_wait(first, second)
    assert second.cancelled()
    again = asyncio.create_task(failing())
    await asyncio.sleep(0)
    await cancel_and_wait(again, raise_errors=False)
    assert isinstance(again.exception(), ValueError)


async def test_wait_ended_lets_the_task_go_on_when_its_caller_is_cancelled() -> None:
    release = asyncio.Event()

    async def finishing() -> str:
        await release.wait()
        return "stored"

    task = asyncio.create_task(finishing())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await wait_ended(task)
    assert not task.done()
    release.set()
    await wait_ended(task)
    assert task.result() == "stored"

    async def failing() -> None:
        raise ValueError("fatal")

    with pytest.raises(ValueError, match="fatal"):
        await wait_ended(asyncio.create_task(failing()))
