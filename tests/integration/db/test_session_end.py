"""How a session ends (bot/db/engine.py: run_to_completion, LoopSession, LoopSessionmaker): in
the caller's task where nothing waits, in a shielded task once something does, and never
abandoned part way by a cancellation, on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.engine import make_engine, make_sessionmaker, run_to_completion
from bot.db.models import ChatLease, utcnow


@pytest.fixture
async def sessionmaker(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


async def test_a_coroutine_that_does_not_wait_runs_in_the_callers_task() -> None:
    caller = asyncio.current_task()

    async def quick() -> object:
        return asyncio.current_task()

    assert await run_to_completion(quick()) is caller


async def test_one_that_waits_ends_even_when_the_caller_is_cancelled() -> None:
    steps: list[str] = []
    callers: list[object] = []

    async def slow() -> str:
        callers.append(asyncio.current_task())
        steps.append("started")
        await asyncio.sleep(0.05)
        callers.append(asyncio.current_task())
        steps.append("ended")
        return "done"

    caller = asyncio.create_task(run_to_completion(slow()))
    await asyncio.sleep(0.01)
    assert steps == ["started"]
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["started", "ended"]  # the cancellation waited for the end
    assert callers[0] is caller and callers[1] is not caller  # then went on in a task
    assert await run_to_completion(slow()) == "done"


async def test_errors_come_out_before_and_after_waiting() -> None:
    async def at_once() -> None:
        raise ValueError("first step")

    async def later() -> None:
        await asyncio.sleep(0)
        raise KeyError("after a wait")

    with pytest.raises(ValueError, match="first step"):
        await run_to_completion(at_once())
    with pytest.raises(KeyError, match="after a wait"):
        await run_to_completion(later())


async def test_a_session_commits_and_ends_on_both_backends(
    sessionmaker: async_sessionmaker[AsyncSession], db_url: str
) -> None:
    loop = asyncio.get_running_loop()
    made: list[object] = []
    default = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: object, **kw: object) -> asyncio.Task:  # type: ignore[type-arg]
        made.append(coro)
        if default is not None:
            return default(loop, coro, **kw)  # type: ignore[arg-type]
        return asyncio.Task(coro, loop=loop, **kw)  # type: ignore[arg-type]

    loop.set_task_factory(counting)  # type: ignore[arg-type]
    try:
        async with sessionmaker.begin() as db:
            db.add(ChatLease(chat_id=1, kind="inbox", owner="a", lease_until=utcnow()))
        async with sessionmaker() as db:
            owner = await db.scalar(select(ChatLease.owner).where(ChatLease.chat_id == 1))
        with pytest.raises(RuntimeError):
            async with sessionmaker.begin() as db:
                db.add(ChatLease(chat_id=2, kind="inbox", owner="b", lease_until=utcnow()))
                await db.flush()
                raise RuntimeError("rolled back")
    finally:
        loop.set_task_factory(default)
    assert owner == "a"
    async with sessionmaker() as db:
        assert await db.scalar(select(ChatLease.owner).where(ChatLease.chat_id == 2)) is None
    if db_url.startswith("sqlite"):
        # The loop's SQLite never waits: three sessions ended without one task (SQLAlchemy's
        # own ends make one task a session, two with begin()).
        assert made == []
    # Every session gave its connection back (SQLite's pool holds one).
    assert sessionmaker.kw["bind"].pool.checkedout() == 0
