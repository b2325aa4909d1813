"""Admin reports: conversations, transcripts, exports, and forgetting a chat.

Everything here reads the same tables the service writes (bot/db/models.py). The only write is
`forget_chat`, which goes through ConversationStore so that it deletes exactly what /forget deletes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.conversations.store import ConversationStore
from bot.db.models import (
    Inbox,
    Message,
    Outbox,
    Session,
    SessionStatus,
)
from bot.reports.rows import MESSAGE_COLUMNS, TranscriptMessage


class AdminError(Exception):
    """An admin command cannot do what was asked; the message says why."""


# --- sessions and transcripts ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One conversation with its message count."""

    id: int
    chat_id: int
    user_id: int | None
    status: str
    persona: str
    messages: int
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


def _summaries_stmt() -> Any:
    counts = (
        select(Message.session_id, func.count().label("n")).group_by(Message.session_id).subquery()
    )
    return select(
        Session.id,
        Session.chat_id,
        Session.user_id,
        Session.status,
        Session.persona,
        func.coalesce(counts.c.n, 0),
        Session.created_at,
        Session.updated_at,
        Session.ended_at,
    ).outerjoin(counts, counts.c.session_id == Session.id)


async def list_sessions(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    active_only: bool = False,
    limit: int = 20,
) -> list[SessionSummary]:
    """Conversations, most recently active first."""
    stmt = _summaries_stmt()
    if active_only:
        stmt = stmt.where(Session.status == SessionStatus.ACTIVE)
    stmt = stmt.order_by(Session.updated_at.desc(), Session.id.desc()).limit(limit)
    async with sessionmaker() as db:
        rows = (await db.execute(stmt)).all()
    return [SessionSummary(*r) for r in rows]


@dataclass(frozen=True, slots=True)
class Transcript:
    """A conversation: its session (with persona) and every message, oldest first."""

    session: SessionSummary
    messages: list[TranscriptMessage] = field(default_factory=list)


async def chat_transcripts(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> list[Transcript]:
    """Every conversation of a chat, past ones first and the current one last."""
    async with sessionmaker() as db:
        sessions = (
            await db.execute(
                _summaries_stmt().where(Session.chat_id == chat_id).order_by(Session.id)
            )
        ).all()
        messages = (
            await db.execute(
                select(Message.session_id, *MESSAGE_COLUMNS)
                .where(Message.chat_id == chat_id)
                .order_by(Message.id)
            )
        ).all()
    transcripts = {row[0]: Transcript(SessionSummary(*row)) for row in sessions}
    for m in messages:
        if m.session_id in transcripts:
            transcripts[m.session_id].messages.append(TranscriptMessage(*m[1:]))
    return list(transcripts.values())


# --- export ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportRow:
    """One message with the conversation it belongs to, flat for JSONL or CSV."""

    chat_id: int
    session_id: int
    user_id: int | None
    persona: str
    session_status: str
    message_id: int
    role: str
    text: str
    created_at: datetime
    delivered_at: datetime | None
    latency_ms: float | None
    # Bot replies: the persona the model read for it (`persona` is the session's now).
    reply_persona: str | None


EXPORT_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ExportRow))


async def export_rows(engine: AsyncEngine, chat_id: int | None = None) -> AsyncIterator[ExportRow]:
    """Every message (of one chat, or all chats) in conversation order, streamed."""
    stmt = select(
        Message.chat_id,
        Message.session_id,
        Session.user_id,
        Session.persona,
        Session.status,
        *MESSAGE_COLUMNS,
    ).join(Session, Session.id == Message.session_id)
    if chat_id is not None:
        stmt = stmt.where(Message.chat_id == chat_id)
    stmt = stmt.order_by(Message.chat_id, Message.session_id, Message.id)
    # Streamed, so that exporting a large database does not load it into memory.
    async with engine.connect() as conn:
        result = await conn.stream(stmt.execution_options(yield_per=500))
        async for row in result:
            yield ExportRow(*row)


# --- forget ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatFootprint:
    """How many rows of each table mention a chat."""

    sessions: int
    messages: int
    outbox: int
    inbox: int

    @property
    def total(self) -> int:
        """All rows together."""
        return self.sessions + self.messages + self.outbox + self.inbox


async def chat_footprint(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> ChatFootprint:
    """Count the rows that mention a chat (what `forget` would delete)."""
    async with sessionmaker() as db:
        counts = []
        for model in (Session, Message, Outbox, Inbox):
            n = await db.scalar(
                select(func.count()).select_from(model).where(model.chat_id == chat_id)
            )
            counts.append(int(n or 0))
    return ChatFootprint(*counts)


async def forget_chat(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> ChatFootprint:
    """Delete everything stored for a chat, as /forget does; returns what was there."""
    before = await chat_footprint(sessionmaker, chat_id)
    await ConversationStore(sessionmaker).forget_chat(chat_id)
    return before
