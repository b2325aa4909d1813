"""Outbox queries: every text the bot must send, until Telegram accepts it. Functions take an
AsyncSession, never commit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.base import table_of
from bot.db.engine import Prepared, core, on_commit
from bot.db.models import Message, Outbox, OutboxKind, utcnow


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
    # An inline keyboard to send with the last part (Bot API JSON), for notices.
    markup: str | None = None
    # The Telegram message to edit with the first part instead of sending one (a regenerated
    # reply after the user edited their message).
    edit_message_id: int | None = None
    # time.monotonic() when delivery read it as pending (bot.service.chat_pool.FRESH_S)
    read_at: float | None = None


_WAITING = (Outbox.sent_at.is_(None), Outbox.failed_at.is_(None))


async def enqueue(
    db: AsyncSession,
    *,
    chat_id: int,
    kind: OutboxKind,
    text: str,
    message_id: int | None = None,
    update_id: int | None = None,
    reply_to_message_id: int | None = None,
    markup: str | None = None,
    edit_message_id: int | None = None,
) -> int:
    """Queue a text for sending; returns the outbox id."""
    # On the session's connection (bot.db.engine.core), built once: one of these a turn.
    result = await _ENQUEUE.execute(
        db,
        {
            "chat_id": chat_id,
            "kind": kind,
            "text": text,
            "message_id": message_id,
            "update_id": update_id,
            "reply_to_message_id": reply_to_message_id,
            "markup": markup,
            "edit_message_id": edit_message_id,
        },
    )
    watch = _QUEUED.get()
    if watch is not None:
        on_commit(db, partial(watch.chats.add, chat_id))
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


_ENQUEUE = Prepared(lambda dialect: insert(table_of(Outbox)))


@dataclass(slots=True)
class QueueWatch:
    """The chats that committed transactions queued texts for (see watching_queued)."""

    chats: set[int] = field(default_factory=set)


_QUEUED: ContextVar[QueueWatch | None] = ContextVar("outbox_queue_watch", default=None)


@contextmanager
def watching_queued() -> Iterator[QueueWatch]:
    """While the block runs (and in the tasks it starts), `enqueue` adds its chat to the
    watch once (and only if) its transaction commits: the inbox worker hands those chats to
    delivery, which then need not scan the outbox to find them."""
    watch = QueueWatch()
    token = _QUEUED.set(watch)
    try:
        yield watch
    finally:
        _QUEUED.reset(token)


async def pending(db: AsyncSession, chat_id: int | None = None) -> list[OutboxRow]:
    """Texts not yet sent nor given up on, oldest first (of one chat, or of all)."""
    if chat_id is None:
        conn = await core(db)
        rows = await conn.execute(select(Outbox.__table__).where(*_WAITING).order_by(Outbox.id))
    else:
        rows = await _PENDING_OF_CHAT.execute(db, {"p_chat_id": chat_id})
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
            r.markup,
            r.edit_message_id,
        )
        for r in rows
    ]


# Built once (bot.db.engine.Prepared): delivery reads a chat's texts for every reply.
_PENDING_OF_CHAT = Prepared(
    lambda dialect: (
        select(Outbox.__table__)
        .where(*_WAITING, Outbox.chat_id == bindparam("p_chat_id"))
        .order_by(Outbox.id)
    )
)


async def pending_chats(db: AsyncSession, limit: int = 1000) -> list[int]:
    """Chats with texts waiting to be sent."""
    # Oldest waiting text first, so that a backlog of more than `limit` chats is FIFO.
    rows = await (await core(db)).scalars(
        select(Outbox.chat_id)
        .where(*_WAITING)
        .group_by(Outbox.chat_id)
        .order_by(func.min(Outbox.id))
        .limit(limit)
    )
    return [int(chat_id) for chat_id in rows]


async def still_pending(db: AsyncSession, outbox_id: int) -> int | None:
    """How many parts of a text went out, if it still waits to be sent; None when it was
    sent, given up on or deleted (a /forget) since it was read."""
    conn = await core(db)
    return await conn.scalar(select(Outbox.parts_sent).where(Outbox.id == outbox_id, *_WAITING))


async def part_sent(db: AsyncSession, outbox_id: int, parts_sent: int) -> None:
    """Record that the first `parts_sent` parts of a long text went out."""
    await db.execute(update(Outbox).where(Outbox.id == outbox_id).values(parts_sent=parts_sent))


async def sent(db: AsyncSession, outbox_id: int, telegram_message_id: int | None = None) -> bool:
    """Mark a text sent, and its bot message delivered; False when the row is gone (deleted
    by a /forget, or withdrawn by an edit, while it was on its way)."""
    now = utcnow()
    row = (await _SENT.execute(db, {"p_id": outbox_id, "sent_at": now})).first()
    if row is None:
        return False
    if row.message_id is not None:
        await _DELIVERED.execute(
            db,
            {
                "p_id": row.message_id,
                "delivered_at": now,
                "telegram_message_id": telegram_message_id,
            },
        )
    return True


# Built once (bot.db.engine.Prepared): every reply is marked sent.
_SENT = Prepared(
    lambda dialect: (
        update(table_of(Outbox)).where(Outbox.id == bindparam("p_id")).returning(Outbox.message_id)
    )
)
_DELIVERED = Prepared(
    lambda dialect: update(table_of(Message)).where(Message.id == bindparam("p_id"))
)


async def withdraw(db: AsyncSession, message_id: int) -> int | None:
    """Take back a reply that has not gone out: the user edited the message it answers.
    Returns the Telegram message the withdrawn reply was to edit (a regenerated reply itself).

    Call it before reading whether the reply was delivered: on PostgreSQL it waits for a
    delivery that is committing the reply as sent, and then leaves that row alone.
    """
    rows = await db.execute(
        delete(Outbox)
        .where(Outbox.message_id == message_id, *_WAITING)
        .returning(Outbox.edit_message_id)
    )
    return next((edit for (edit,) in rows if edit is not None), None)


async def withdrawn_reply_went_out(
    db: AsyncSession, row: OutboxRow, telegram_message_id: int
) -> None:
    """A reply withdrawn by an edit while its request was on its way went out after all: the
    reply that replaces it (a later reply to the same user message) edits that message
    instead of appearing beside it."""
    if row.kind != OutboxKind.REPLY or row.reply_to_message_id is None:
        return
    await db.execute(
        update(Outbox)
        .where(
            Outbox.chat_id == row.chat_id,
            Outbox.kind == OutboxKind.REPLY,
            Outbox.reply_to_message_id == row.reply_to_message_id,
            Outbox.id > row.id,
            Outbox.parts_sent == 0,
            Outbox.edit_message_id.is_(None),
            *_WAITING,
        )
        .values(edit_message_id=telegram_message_id)
    )


async def attempt_failed(
    db: AsyncSession, outbox_id: int, error: str, give_up: bool = False
) -> None:
    """Count a failed send; with give_up the text is not tried again."""
    values: dict[str, object] = {"attempts": Outbox.attempts + 1, "last_error": error}
    if give_up:
        values["failed_at"] = utcnow()
    await db.execute(update(Outbox).where(Outbox.id == outbox_id).values(**values))


async def backlog(db: AsyncSession) -> int:
    """How many texts are waiting to be sent."""
    return int(await db.scalar(select(func.count()).select_from(Outbox).where(*_WAITING)) or 0)
