"""Queries. Functions here take an AsyncSession, never commit, and return plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.models import Inbox, Message, Outbox, Session, utcnow


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A conversation, detached from the ORM."""

    id: int
    chat_id: int
    user_id: int | None
    persona: str
    status: str
    created_at: datetime
    ended_at: datetime | None
    # The id of the conversation's newest message when this row was read (None: no message
    # yet): a cached agent is only used while it has seen exactly this far.
    last_message_id: int | None = None


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One utterance of a conversation."""

    id: int
    session_id: int
    role: str
    text: str


@dataclass(frozen=True, slots=True)
class InboxRow:
    """A stored Telegram update."""

    update_id: int
    chat_id: int | None
    kind: str
    payload: str
    status: str
    attempts: int


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A text waiting to be sent."""

    id: int
    chat_id: int
    kind: str
    text: str
    message_id: int | None
    reply_to_message_id: int | None
    parts_sent: int
    attempts: int


def _session_row(s: Session, last_message_id: int | None = None) -> SessionRow:
    return SessionRow(
        s.id, s.chat_id, s.user_id, s.persona, s.status, s.created_at, s.ended_at, last_message_id
    )


# --- inbox ---------------------------------------------------------------------------------


async def insert_inbox(
    db: AsyncSession,
    *,
    update_id: int,
    chat_id: int | None,
    user_id: int | None,
    kind: str,
    payload: str,
    status: str = "pending",
) -> bool:
    """Store an update unless its update_id is already there; True if it was new."""
    values = {
        "update_id": update_id,
        "chat_id": chat_id,
        "user_id": user_id,
        "kind": kind,
        "payload": payload,
        "status": status,
        "received_at": utcnow(),
        "processed_at": utcnow() if status != "pending" else None,
    }
    dialect = db.get_bind().dialect.name
    ins = pg_insert(Inbox) if dialect == "postgresql" else sqlite_insert(Inbox)
    stmt = ins.values(**values).on_conflict_do_nothing(index_elements=["update_id"])
    result = await db.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


async def pending_inbox(db: AsyncSession, limit: int = 1000) -> list[InboxRow]:
    """Updates not yet processed, oldest first."""
    rows = await db.scalars(
        select(Inbox).where(Inbox.status == "pending").order_by(Inbox.update_id).limit(limit)
    )
    return [InboxRow(r.update_id, r.chat_id, r.kind, r.payload, r.status, r.attempts) for r in rows]


async def get_inbox_status(db: AsyncSession, update_id: int) -> str | None:
    """The status of one update, or None if it was never stored."""
    return await db.scalar(select(Inbox.status).where(Inbox.update_id == update_id))


class StaleUpdate(Exception):
    """The update was closed (or deleted) by someone else while this turn was being made."""


async def finish_inbox(
    db: AsyncSession, update_id: int, status: str = "done", error: str | None = None
) -> None:
    """Close a pending update (done, failed or ignored).

    This is the fence of every turn: if the update is no longer pending (another process took
    it over after our lease ran out, or an admin deleted it), raising rolls back the whole turn.
    """
    result = await db.execute(
        update(Inbox)
        .where(Inbox.update_id == update_id, Inbox.status == "pending")
        .values(status=status, error=error, processed_at=utcnow())
    )
    if not getattr(result, "rowcount", 0):
        raise StaleUpdate(f"update {update_id} is no longer pending")


async def bump_inbox_attempts(db: AsyncSession, update_id: int, error: str) -> int:
    """Count a failed try at an update; returns the new count."""
    await db.execute(
        update(Inbox)
        .where(Inbox.update_id == update_id)
        .values(attempts=Inbox.attempts + 1, error=error)
    )
    return int(await db.scalar(select(Inbox.attempts).where(Inbox.update_id == update_id)) or 0)


# --- sessions ------------------------------------------------------------------------------


async def get_active_session(db: AsyncSession, chat_id: int) -> SessionRow | None:
    """The chat's active conversation, if any, with its newest message id (same transaction)."""
    s = await db.scalar(
        select(Session).where(Session.chat_id == chat_id, Session.status == "active")
    )
    if s is None:
        return None
    last = await db.scalar(select(func.max(Message.id)).where(Message.session_id == s.id))
    return _session_row(s, last)


async def latest_persona(db: AsyncSession, chat_id: int) -> str:
    """The persona of the chat's most recent conversation ('' if none)."""
    persona = await db.scalar(
        select(Session.persona)
        .where(Session.chat_id == chat_id)
        .order_by(Session.id.desc())
        .limit(1)
    )
    return persona or ""


async def create_session(
    db: AsyncSession, chat_id: int, user_id: int | None, persona: str
) -> SessionRow:
    """Start a conversation (the caller made sure none is active)."""
    s = Session(chat_id=chat_id, user_id=user_id, persona=persona, status="active")
    db.add(s)
    await db.flush()
    return _session_row(s)


async def set_session_persona(db: AsyncSession, session_id: int, persona: str) -> None:
    """Change a conversation's persona."""
    await db.execute(
        update(Session).where(Session.id == session_id).values(persona=persona, updated_at=utcnow())
    )


async def end_session(db: AsyncSession, session_id: int) -> None:
    """Mark a conversation done; its messages stay for the admins."""
    now = utcnow()
    await db.execute(
        update(Session)
        .where(Session.id == session_id, Session.status == "active")
        .values(status="done", ended_at=now, updated_at=now)
    )


async def touch_session(db: AsyncSession, session_id: int) -> None:
    """Record activity on a conversation."""
    await db.execute(update(Session).where(Session.id == session_id).values(updated_at=utcnow()))


# --- messages ------------------------------------------------------------------------------


async def add_message(
    db: AsyncSession,
    *,
    session_id: int,
    chat_id: int,
    role: str,
    text: str,
    update_id: int | None = None,
    telegram_message_id: int | None = None,
    latency_ms: float | None = None,
) -> int:
    """Append an utterance; returns its id."""
    m = Message(
        session_id=session_id,
        chat_id=chat_id,
        role=role,
        text=text,
        update_id=update_id,
        telegram_message_id=telegram_message_id,
        latency_ms=latency_ms,
    )
    db.add(m)
    await db.flush()
    return m.id


async def tail_messages(db: AsyncSession, session_id: int, limit: int | None) -> list[MessageRow]:
    """The last `limit` messages of a conversation (all if None), oldest first."""
    stmt = select(Message.id, Message.session_id, Message.role, Message.text).where(
        Message.session_id == session_id
    )
    if limit is not None:
        stmt = stmt.order_by(Message.id.desc()).limit(limit)
        rows = list(await db.execute(stmt))
        rows.reverse()
    else:
        rows = list(await db.execute(stmt.order_by(Message.id)))
    return [MessageRow(r.id, r.session_id, r.role, r.text) for r in rows]


async def count_messages(db: AsyncSession, session_id: int) -> int:
    """How many messages a conversation has."""
    return int(await db.scalar(select(func.count()).where(Message.session_id == session_id)) or 0)


# --- outbox --------------------------------------------------------------------------------


async def enqueue(
    db: AsyncSession,
    *,
    chat_id: int,
    kind: str,
    text: str,
    message_id: int | None = None,
    update_id: int | None = None,
    reply_to_message_id: int | None = None,
) -> int:
    """Queue a text for sending; returns the outbox id."""
    o = Outbox(
        chat_id=chat_id,
        kind=kind,
        text=text,
        message_id=message_id,
        update_id=update_id,
        reply_to_message_id=reply_to_message_id,
    )
    db.add(o)
    await db.flush()
    return o.id


async def pending_outbox(db: AsyncSession, chat_id: int | None = None) -> list[OutboxRow]:
    """Texts not yet sent nor given up on, oldest first."""
    stmt = select(Outbox).where(Outbox.sent_at.is_(None), Outbox.failed_at.is_(None))
    if chat_id is not None:
        stmt = stmt.where(Outbox.chat_id == chat_id)
    rows = await db.scalars(stmt.order_by(Outbox.id))
    return [
        OutboxRow(
            r.id,
            r.chat_id,
            r.kind,
            r.text,
            r.message_id,
            r.reply_to_message_id,
            r.parts_sent,
            r.attempts,
        )
        for r in rows
    ]


async def outbox_still_pending(db: AsyncSession, outbox_id: int) -> int | None:
    """How many parts of a text went out, if it still waits to be sent; None when it was
    sent, given up on or deleted (a /forget) since it was read."""
    return await db.scalar(
        select(Outbox.parts_sent).where(
            Outbox.id == outbox_id, Outbox.sent_at.is_(None), Outbox.failed_at.is_(None)
        )
    )


async def outbox_part_sent(db: AsyncSession, outbox_id: int, parts_sent: int) -> None:
    """Record that the first `parts_sent` parts of a long text went out."""
    await db.execute(update(Outbox).where(Outbox.id == outbox_id).values(parts_sent=parts_sent))


async def outbox_sent(
    db: AsyncSession, outbox_id: int, telegram_message_id: int | None = None
) -> None:
    """Mark a text sent, and its bot message delivered."""
    now = utcnow()
    await db.execute(update(Outbox).where(Outbox.id == outbox_id).values(sent_at=now))
    message_id = await db.scalar(select(Outbox.message_id).where(Outbox.id == outbox_id))
    if message_id is not None:
        await db.execute(
            update(Message)
            .where(Message.id == message_id)
            .values(delivered_at=now, telegram_message_id=telegram_message_id)
        )


async def outbox_attempt_failed(
    db: AsyncSession, outbox_id: int, error: str, give_up: bool = False
) -> None:
    """Count a failed send; with give_up the text is not tried again."""
    values: dict[str, object] = {"attempts": Outbox.attempts + 1, "last_error": error}
    if give_up:
        values["failed_at"] = utcnow()
    await db.execute(update(Outbox).where(Outbox.id == outbox_id).values(**values))


# --- whole chats ---------------------------------------------------------------------------


async def delete_chat(
    db: AsyncSession, chat_id: int, keep_after_update_id: int | None = None
) -> int:
    """Delete every row that mentions a chat; returns how many sessions went.

    With `keep_after_update_id` (a user's /forget), updates that arrived after that one and are
    still waiting are kept: they were sent after the /forget and are still owed an answer.
    """
    await db.execute(delete(Outbox).where(Outbox.chat_id == chat_id))
    await db.execute(delete(Message).where(Message.chat_id == chat_id))
    result = await db.execute(delete(Session).where(Session.chat_id == chat_id))
    inbox = delete(Inbox).where(Inbox.chat_id == chat_id)
    if keep_after_update_id is not None:
        inbox = inbox.where(
            ~((Inbox.status == "pending") & (Inbox.update_id > keep_after_update_id))
        )
    await db.execute(inbox)
    return int(getattr(result, "rowcount", 0) or 0)
