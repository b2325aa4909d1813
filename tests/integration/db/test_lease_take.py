"""bot.db.leases.take, the one statement that decides who works on a chat, on both backends:
a free, an own, a live other's and an expired lease, and many owners racing for one chat; and
give_back_many, which gives several back in one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import leases
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import ChatLease, utcnow


@pytest.fixture
async def sessionmaker(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


async def _take(sm: async_sessionmaker[AsyncSession], owner: str, chat_id: int = 7) -> object:
    async with sm.begin() as db:
        return await leases.take(db, chat_id, "inbox", owner, 60.0)


async def _row(sm: async_sessionmaker[AsyncSession], chat_id: int = 7) -> tuple[str, object]:
    async with sm() as db:
        row = (
            await db.execute(
                select(ChatLease.owner, ChatLease.lease_until).where(
                    ChatLease.chat_id == chat_id, ChatLease.kind == "inbox"
                )
            )
        ).one()
    return row[0], row[1]


async def test_take_writes_a_free_lease_renews_its_own_and_leaves_a_live_others(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    first = await _take(sessionmaker, "a")
    assert first is not None
    assert await _row(sessionmaker) == ("a", first)  # what it returns is what it wrote
    assert first > utcnow() + timedelta(seconds=50)  # type: ignore[operator]

    assert await _take(sessionmaker, "b") is None  # a's lease runs for a minute
    assert await _row(sessionmaker) == ("a", first)

    await asyncio.sleep(0.01)
    renewed = await _take(sessionmaker, "a")
    assert renewed is not None and renewed > first  # type: ignore[operator]
    assert await _row(sessionmaker) == ("a", renewed)


async def test_take_takes_an_expired_lease_over(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    assert await _take(sessionmaker, "a") is not None
    async with sessionmaker.begin() as db:
        await db.execute(update(ChatLease).values(lease_until=utcnow() - timedelta(seconds=1)))
    taken = await _take(sessionmaker, "b")
    assert taken is not None
    assert await _row(sessionmaker) == ("b", taken)


async def test_take_is_one_statement(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    statements: list[str] = []
    engine = sessionmaker.kw["bind"]

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        assert await _take(sessionmaker, "a") is not None  # no row yet: the insert
        assert await _take(sessionmaker, "b") is None  # a live other's: nothing written
        assert await _take(sessionmaker, "a") is not None  # its own: the update
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)
    # Three takes, three statements (the transactions' BEGIN is no cursor statement).
    assert len(statements) == 3, statements


async def test_of_many_owners_racing_for_a_chat_exactly_one_wins(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    for chat_id in range(5):  # a free chat each round
        results = await asyncio.gather(
            *(_take(sessionmaker, f"owner{k}", chat_id) for k in range(8)),
            return_exceptions=True,
        )
        winners = [
            k for k, r in enumerate(results) if r is not None and not isinstance(r, Exception)
        ]
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors
        assert len(winners) == 1, results
        owner, _ = await _row(sessionmaker, chat_id)
        assert owner == f"owner{winners[0]}"


async def test_give_back_many_deletes_only_the_rows_as_they_were_written(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    written = {chat_id: await _take(sessionmaker, "a", chat_id) for chat_id in (7, 8, 9)}
    await asyncio.sleep(0.01)
    renewed = await _take(sessionmaker, "a", 9)  # renewed since: no longer as written
    assert await _take(sessionmaker, "b", 10) is not None  # another owner's
    async with sessionmaker.begin() as db:
        await leases.give_back_many(db, {**written, 10: written[7]}, "inbox", "a")  # type: ignore[dict-item]
    async with sessionmaker() as db:
        left = dict((await db.execute(select(ChatLease.chat_id, ChatLease.owner))).all())
    assert left == {9: "a", 10: "b"}
    assert await _row(sessionmaker, 9) == ("a", renewed)
