"""bot/tasks.py: stopping a task, and a caller's own deadline around that."""

from __future__ import annotations

import asyncio

import pytest

from bot.tasks import cancel_and_wait


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
