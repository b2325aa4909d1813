"""`chat_votes` (bot/reports/chat_votes.py) on real rows, SQLite and PostgreSQL: one (up, votes)
pair per chat and variant, the per-user cap, the experiment filter and the `until` cut-off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.models import Session
from bot.reports.chat_votes import chat_vote_table, chat_votes
from bot.reports.variant_stats import USER_VOTE_CAP
from tests.support.dbutil import add_assignment, add_voted_replies

DAY = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def add_votes(
    sessionmaker: async_sessionmaker[AsyncSession],
    chat: int,
    variant: str,
    votes: list[tuple[int, int]],  # (user, value)
    *,
    experiment: str = "exp",
    at: datetime = DAY,
) -> None:
    async with sessionmaker.begin() as db:
        add_assignment(db, chat, experiment, variant, DAY)
        s = Session(chat_id=chat, user_id=chat, created_at=DAY)
        db.add(s)
        await db.flush()
        await add_voted_replies(db, s.id, chat, variant, votes, at)


async def test_pairs_per_chat_with_the_per_user_cap(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    assert USER_VOTE_CAP == 10
    # Chat 1 (variant a): user 7 votes 30 times (20 up, 10 down), user 8 once (up).
    # User 7 has 30 votes on a, more than the cap of 10: each weighs 10/30 = 1/3, so chat 1
    # counts up = 20/3 + 1, votes = 10 + 1.
    await add_votes(sessionmaker, 1, "a", [(7, 1)] * 20 + [(7, -1)] * 10 + [(8, 1)])
    # Chat 2 (variant a): user 9, 3 votes (1 up): under the cap, counted as cast.
    await add_votes(sessionmaker, 2, "a", [(9, 1), (9, -1), (9, -1)])
    # Chat 3 (variant b): user 7 again, 5 votes: the cap is per variant, so these count fully.
    await add_votes(sessionmaker, 3, "b", [(7, 1)] * 5)
    # Chat 4, another experiment.
    await add_votes(sessionmaker, 4, "b", [(5, -1)], experiment="other")
    async with sessionmaker() as db:
        pairs = await chat_votes(db)
        table = await chat_vote_table(db)
        only = await chat_votes(db, "exp")
    assert sorted(pairs) == ["a", "b"]
    assert sorted(pairs["a"]) == [(1.0, 3.0), pytest.approx((20 / 3 + 1, 11.0))]
    assert sorted(pairs["b"]) == [(0.0, 1.0), (5.0, 5.0)]
    first = table["a"][1]
    assert (first.up, first.down) == (21, 10)  # the raw counts stay as cast
    assert only["b"] == [(5.0, 5.0)]  # chat 4 is in "other"


async def test_until_reads_the_votes_as_they_stood(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await add_votes(sessionmaker, 1, "a", [(1, 1), (1, -1)], at=DAY)
    await add_votes(sessionmaker, 2, "a", [(2, 1)], at=DAY + timedelta(hours=1))
    async with sessionmaker() as db:
        before = await chat_votes(db, until=DAY + timedelta(minutes=30))
        after = await chat_votes(db, until=DAY + timedelta(hours=1))
    assert before == {"a": [(1.0, 2.0)]}
    assert sorted(after["a"]) == [(1.0, 1.0), (1.0, 2.0)]
