"""RETENTION_DAYS deletes exactly the rows past the limit, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from bot.conversations.store import ConversationStore
from bot.db.models import (
    ArenaMatch,
    Assignment,
    Inbox,
    Message,
    Outbox,
    Rating,
    Session,
    Vote,
)
from bot.reports.stats import format_stats, stats
from bot.service.retention import BATCH, purge, totals

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=31)
NEW = NOW - timedelta(days=29)


async def _seed(store: ConversationStore) -> dict[str, int]:
    """Chat 1: one old and one new conversation; chat 2: old only; chat 3: many old ones."""
    ids: dict[str, int] = {}
    async with store.sessionmaker.begin() as db:
        for chat in (1, 2, 3):
            db.add(Assignment(chat_id=chat, experiment="e", variant="a", source="hash"))
        plan = [("old1", 1, OLD), ("new1", 1, NEW), ("old2", 2, OLD)]
        plan += [(f"bulk{i}", 3, OLD) for i in range(BATCH + 5)]  # more than one batch
        for name, chat, at in plan:
            s = Session(chat_id=chat, persona="p", status="done", created_at=at, updated_at=at)
            db.add(s)
            await db.flush()
            user = Message(session_id=s.id, chat_id=chat, role="user", text="hi", created_at=at)
            bot = Message(session_id=s.id, chat_id=chat, role="bot", text="yo", created_at=at)
            db.add_all([user, bot])
            await db.flush()
            db.add(Vote(chat_id=chat, message_id=bot.id, user_id=chat, value=1, source="button"))
            db.add(Rating(chat_id=chat, session_id=s.id, value=4))
            db.add(ArenaMatch(chat_id=chat, session_id=s.id, user_message_id=user.id))
            db.add(Outbox(chat_id=chat, kind="reply", text="yo", message_id=bot.id, sent_at=NEW))
            ids[name] = s.id
        # Texts and updates not tied to a conversation: by their own dates.
        db.add_all(
            [
                Outbox(chat_id=9, kind="notice", text="sent long ago", sent_at=OLD),
                Outbox(chat_id=9, kind="notice", text="given up long ago", failed_at=OLD),
                Outbox(chat_id=9, kind="notice", text="sent lately", sent_at=NEW),
                Outbox(chat_id=9, kind="notice", text="never sent", created_at=OLD),
                Inbox(update_id=1, chat_id=9, payload="{}", status="done", processed_at=OLD),
                Inbox(update_id=2, chat_id=9, payload="{}", status="done", processed_at=NEW),
                Inbox(update_id=3, chat_id=9, payload="{}", status="pending", received_at=OLD),
            ]
        )
    return ids


async def test_retention_deletes_exactly_what_is_past_the_limit(store: ConversationStore) -> None:
    ids = await _seed(store)
    purged = await purge(store.sessionmaker, 30, now=NOW)
    assert (purged.conversations, purged.messages) == (BATCH + 7, 2 * (BATCH + 7))
    async with store.sessionmaker() as db:
        assert list(await db.scalars(select(Session.id))) == [ids["new1"]]
        assert set(await db.scalars(select(Message.session_id))) == {ids["new1"]}
        assert list(await db.scalars(select(Rating.session_id))) == [ids["new1"]]
        assert list(await db.scalars(select(ArenaMatch.session_id))) == [ids["new1"]]
        assert len(list(await db.scalars(select(Vote.id)))) == 1
        # A chat keeps its variant (until /forget), conversations or not.
        assert sorted(await db.scalars(select(Assignment.chat_id))) == [1, 2, 3]
        texts = set(await db.scalars(select(Outbox.text)))
        assert texts == {"yo", "sent lately", "never sent"}
        assert sorted(await db.scalars(select(Inbox.update_id))) == [2, 3]
    assert purged.outbox == 2 and purged.inbox == 1
    # A second run finds nothing; the totals add up across runs.
    again = await purge(store.sessionmaker, 30, now=NOW)
    assert (again.conversations, again.outbox, again.inbox) == (0, 0, 0)
    async with store.sessionmaker() as db:
        assert await totals(db) == {
            "retention_conversations": BATCH + 7,
            "retention_messages": 2 * (BATCH + 7),
            "retention_outbox": 2,
            "retention_inbox": 1,
        }
    figures = await stats(store.sessionmaker, retention_days=30)
    assert f"Retention: 30 days; {BATCH + 7} conversations deleted so far" in format_stats(figures)
