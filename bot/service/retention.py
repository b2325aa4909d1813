"""RETENTION_DAYS: conversations, their feedback and delivered texts are deleted after N days.

A conversation goes when its last activity (`sessions.updated_at`: a turn, a persona change) is
older than the limit, with its messages, votes, ratings and arena duels; so do outbox rows sent
or given up on before the limit and closed inbox rows processed before it. A chat's variant
assignment stays until /forget (a chat keeps its variant). Deletion runs in small batches, each its
own transaction, so it never holds long locks on a busy database; the totals are kept in
`counters` for `admin stats`. The service runs it at start and every hour.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.dialect import insert_unless_present
from bot.db.models import (
    ArenaMatch,
    Counter,
    Inbox,
    InboxStatus,
    Message,
    Outbox,
    Rating,
    Session,
    Vote,
    utcnow,
)

log = logging.getLogger(__name__)

BATCH = 200
INTERVAL_S = 3600.0
COUNTERS = ("retention_conversations", "retention_messages", "retention_outbox", "retention_inbox")


@dataclass(frozen=True, slots=True)
class Purged:
    """What one run deleted."""

    conversations: int = 0
    messages: int = 0
    outbox: int = 0
    inbox: int = 0


def _count(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


async def _add(db: AsyncSession, name: str, value: int) -> None:
    if not value:
        return
    await insert_unless_present(
        db, Counter, {"name": name, "value": 0, "updated_at": utcnow()}, ["name"]
    )
    await db.execute(
        update(Counter)
        .where(Counter.name == name)
        .values(value=Counter.value + value, updated_at=utcnow())
    )


async def _conversations(db: AsyncSession, cutoff: datetime) -> tuple[int, int]:
    ids = list(
        await db.scalars(
            select(Session.id).where(Session.updated_at < cutoff).order_by(Session.id).limit(BATCH)
        )
    )
    if not ids:
        return 0, 0
    messages = select(Message.id).where(Message.session_id.in_(ids))
    await db.execute(delete(Vote).where(Vote.message_id.in_(messages)))
    await db.execute(delete(Outbox).where(Outbox.message_id.in_(messages)))
    await db.execute(delete(ArenaMatch).where(ArenaMatch.session_id.in_(ids)))
    await db.execute(delete(Rating).where(Rating.session_id.in_(ids)))
    gone = _count(await db.execute(delete(Message).where(Message.session_id.in_(ids))))
    await db.execute(delete(Session).where(Session.id.in_(ids)))
    # A chat's variant assignment stays (a chat keeps its variant until /forget: docs/guarantees.md,
    # invariant 10); it holds no conversation, only which variant answers the chat.
    return len(ids), gone


async def _rows(db: AsyncSession, table: type[Outbox] | type[Inbox], cutoff: datetime) -> int:
    if table is Outbox:
        old = (Outbox.sent_at < cutoff) | (Outbox.failed_at < cutoff)
        ids = select(Outbox.id).where(old).order_by(Outbox.id).limit(BATCH)
        return _count(await db.execute(delete(Outbox).where(Outbox.id.in_(ids))))
    ids = (
        select(Inbox.id)
        .where(Inbox.status != InboxStatus.PENDING, Inbox.processed_at < cutoff)
        .order_by(Inbox.id)
        .limit(BATCH)
    )
    return _count(await db.execute(delete(Inbox).where(Inbox.id.in_(ids))))


async def purge(
    sessionmaker: async_sessionmaker[AsyncSession], days: int, *, now: datetime | None = None
) -> Purged:
    """Delete everything older than `days` days, batch by batch; returns the totals."""
    cutoff = (now or utcnow()) - timedelta(days=days)
    conversations = messages = outbox_rows = inbox_rows = 0
    while True:
        async with sessionmaker.begin() as db:
            n, m = await _conversations(db, cutoff)
            await _add(db, "retention_conversations", n)
            await _add(db, "retention_messages", m)
        conversations, messages = conversations + n, messages + m
        if n < BATCH:
            break
    for table, name in ((Outbox, "retention_outbox"), (Inbox, "retention_inbox")):
        while True:
            async with sessionmaker.begin() as db:
                n = await _rows(db, table, cutoff)
                await _add(db, name, n)
            if table is Outbox:
                outbox_rows += n
            else:
                inbox_rows += n
            if n < BATCH:
                break
    purged = Purged(conversations, messages, outbox_rows, inbox_rows)
    if any((conversations, messages, outbox_rows, inbox_rows)):
        log.info("retention (%d days): deleted %s", days, purged)
    return purged


async def totals(db: AsyncSession) -> dict[str, int]:
    """Everything retention deleted so far, by counter name."""
    rows = await db.execute(select(Counter.name, Counter.value).where(Counter.name.in_(COUNTERS)))
    found = {str(name): int(value) for name, value in rows}
    return {name: found.get(name, 0) for name in COUNTERS}


async def run_forever(
    sessionmaker: async_sessionmaker[AsyncSession], days: int, interval_s: float = INTERVAL_S
) -> None:
    """Purge now and every `interval_s`; a failing run is logged and retried next time."""
    while True:
        try:
            await purge(sessionmaker, days)
        except Exception:  # the database may be down; the next run retries
            log.exception("retention run failed; retrying in %.0f s", interval_s)
        await asyncio.sleep(interval_s)
