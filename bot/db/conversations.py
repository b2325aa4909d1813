"""Conversation queries: sessions and their messages, and deleting a whole chat. Functions
take an AsyncSession, never commit, and return plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Insert, Select, bindparam, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db import variants
from bot.db.base import table_of
from bot.db.engine import Prepared
from bot.db.models import (
    AccessRefusal,
    ArenaMatch,
    Assignment,
    ChatSetting,
    Inbox,
    InboxStatus,
    Message,
    Outbox,
    Rating,
    Role,
    Session,
    SessionStatus,
    Vote,
    utcnow,
)


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
    # The model variant the chat is assigned to (None: not yet, or not read with the row).
    variant: str | None = None
    # An /arena request waiting for the session's next message (its arena_matches id).
    arena_match_id: int | None = None


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One utterance of a conversation."""

    id: int
    session_id: int
    role: str
    text: str
    # A bot reply's text as the model produced it, where the text shown differs (None: the
    # same); a conversation rebuilt for the model reads this one.
    model_text: str | None = None


def _session_row(
    s: Session,
    last_message_id: int | None = None,
    variant: str | None = None,
    arena_match_id: int | None = None,
) -> SessionRow:
    return SessionRow(
        s.id,
        s.chat_id,
        s.user_id,
        s.persona,
        s.status,
        s.created_at,
        s.ended_at,
        last_message_id,
        variant,
        arena_match_id,
    )


# --- sessions ------------------------------------------------------------------------------


async def get_active_session(db: AsyncSession, chat_id: int) -> SessionRow | None:
    """The chat's active conversation, if any, with its newest message id, its variant and any
    waiting /arena request (one statement: this runs on every turn)."""
    row = (await _ACTIVE_SESSION.execute(db, {"p_chat_id": chat_id})).first()
    return None if row is None else SessionRow(**row._mapping)


def _active_session() -> Select[Any]:
    """get_active_session's one statement: columns, not an ORM object."""
    newest = select(func.max(Message.id)).where(Message.session_id == Session.id).scalar_subquery()
    variant = (
        select(Assignment.variant).where(Assignment.chat_id == Session.chat_id).scalar_subquery()
    )
    arena = (
        select(ArenaMatch.id)
        .where(ArenaMatch.session_id == Session.id, ArenaMatch.user_message_id.is_(None))
        .limit(1)
        .scalar_subquery()
    )
    s = Session.__table__.c
    return (
        select(s.id, s.chat_id, s.user_id, s.persona, s.status, s.created_at, s.ended_at)
        .add_columns(
            newest.label("last_message_id"),
            variant.label("variant"),
            arena.label("arena_match_id"),
        )
        .where(s.chat_id == bindparam("p_chat_id"), s.status == SessionStatus.ACTIVE)
    )


# Built once (bot.db.engine.Prepared): every turn reads it.
_ACTIVE_SESSION = Prepared(lambda dialect: _active_session())


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
    s = Session(chat_id=chat_id, user_id=user_id, persona=persona, status=SessionStatus.ACTIVE)
    db.add(s)
    await db.flush()
    return _session_row(s)


async def set_session_persona(
    db: AsyncSession, session_id: int, persona: str, safety: str | None = None
) -> None:
    """Change a conversation's persona (with the safety gate's mark, if any)."""
    await db.execute(
        update(Session)
        .where(Session.id == session_id)
        .values(persona=persona, persona_safety=safety, updated_at=utcnow())
    )


async def end_session(db: AsyncSession, session_id: int) -> None:
    """Mark a conversation done; its messages stay for the admins."""
    now = utcnow()
    await db.execute(
        update(Session)
        .where(Session.id == session_id, Session.status == SessionStatus.ACTIVE)
        .values(status=SessionStatus.DONE, ended_at=now, updated_at=now)
    )


async def touch_session(db: AsyncSession, session_id: int) -> None:
    """Record activity on a conversation."""
    await _TOUCH_SESSION.execute(db, {"p_id": session_id, "updated_at": utcnow()})


_TOUCH_SESSION = Prepared(
    lambda dialect: update(table_of(Session)).where(Session.id == bindparam("p_id"))
)


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyFacts:
    """What a bot reply's row keeps besides its text, from the responder and the safety gate;
    one value, so that the use cases pass it down whole instead of five keywords each."""

    latency_ms: float | None = None
    # The model variant that produced the reply, and its time in the model.
    variant: str | None = None
    model_ms: float | None = None
    # The variant's identity (variants.version_id) when it produced the reply; None: not
    # known to the caller, and the name's current identity is stored.
    variant_version: int | None = None
    # What the safety gate did (bot.safety.SafetyMark; None: it passed, or SAFETY=off), and
    # the offensive reply that was not sent in its place.
    safety: str | None = None
    unsafe_text: str | None = None
    # The persona the model read for the reply (the SessionRow's the responder was handed).
    # None: not known to the caller; the conversation's persona in the database, read in the
    # same transaction, is stored (within a chat's turn nothing changes it meanwhile).
    persona: str | None = None
    # The model's own text where the stored text differs from it (Reply.model_text).
    model_text: str | None = None


# A user's message, or a reply nothing is known of besides its text.
NO_FACTS = ReplyFacts()


async def add_message(
    db: AsyncSession,
    *,
    session_id: int,
    chat_id: int,
    role: Role,
    text: str,
    update_id: int | None = None,
    telegram_message_id: int | None = None,
    facts: ReplyFacts = NO_FACTS,
) -> int:
    """Append an utterance (a bot reply with its `facts`); returns its id."""
    values: dict[str, Any] = {
        "session_id": session_id,
        "chat_id": chat_id,
        "role": role,
        "text": text,
        "update_id": update_id,
        "telegram_message_id": telegram_message_id,
        "latency_ms": facts.latency_ms,
        "variant": facts.variant,
        "model_ms": facts.model_ms,
        "safety": facts.safety,
        "unsafe_text": facts.unsafe_text,
        "model_text": facts.model_text if role == Role.BOT else None,
    }
    # A reply keeps the persona it was made with: the caller's, else the conversation's now.
    persona_of_session = role == Role.BOT and facts.persona is None
    if persona_of_session:
        values["p_session_id"] = session_id
    else:
        values["persona"] = facts.persona if role == Role.BOT else None
    # And the variant's identity: the caller's, else the variant's current one.
    identity_of_variant = facts.variant_version is None and facts.variant is not None
    if identity_of_variant:
        values["p_variant"] = facts.variant
    else:
        values["variant_version"] = facts.variant_version
    # On the session's connection, not through the ORM's unit of work (bot.db.engine.core),
    # built once: two of these a turn.
    result = await _INSERT_MESSAGE[persona_of_session, identity_of_variant].execute(db, values)
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _insert_message(persona_of_session: bool, identity_of_variant: bool, dialect: str) -> Insert:
    """add_message's INSERT, its columns those named in its parameters, and the persona and
    the variant's identity read by the statement itself where the caller did not know them."""
    statement = insert(table_of(Message))
    if persona_of_session:
        persona = select(Session.persona).where(Session.id == bindparam("p_session_id"))
        statement = statement.values(persona=persona.scalar_subquery())
    if identity_of_variant:
        statement = statement.values(variant_version=variants.identity_of(bindparam("p_variant")))
    return statement


_INSERT_MESSAGE = {
    (persona, identity): Prepared(partial(_insert_message, persona, identity))
    for persona in (False, True)
    for identity in (False, True)
}


async def tail_messages(
    db: AsyncSession, session_id: int, limit: int | None, upto: int | None = None
) -> list[MessageRow]:
    """The last `limit` messages of a conversation (all if None), oldest first; only those up
    to message id `upto` when given."""
    stmt = select(
        Message.id, Message.session_id, Message.role, Message.text, Message.model_text
    ).where(Message.session_id == session_id)
    if upto is not None:
        stmt = stmt.where(Message.id <= upto)
    if limit is not None:
        stmt = stmt.order_by(Message.id.desc()).limit(limit)
        rows = list(await db.execute(stmt))
        rows.reverse()
    else:
        rows = list(await db.execute(stmt.order_by(Message.id)))
    return [MessageRow(r.id, r.session_id, r.role, r.text, r.model_text) for r in rows]


@dataclass(frozen=True, slots=True)
class NewestMessage:
    """One of a conversation's newest messages (edit-regenerate)."""

    id: int
    role: str
    telegram_message_id: int | None


async def newest_messages(db: AsyncSession, session_id: int, limit: int) -> list[NewestMessage]:
    """A conversation's `limit` newest messages, newest first."""
    rows = await db.execute(
        select(Message.id, Message.role, Message.telegram_message_id)
        .where(Message.session_id == session_id)
        .order_by(Message.id.desc())
        .limit(limit)
    )
    return [NewestMessage(r.id, r.role, r.telegram_message_id) for r in rows]


async def telegram_message_id(db: AsyncSession, message_id: int) -> int | None:
    """The Telegram message of a bot reply, once it was delivered."""
    return await db.scalar(select(Message.telegram_message_id).where(Message.id == message_id))


async def set_message_text(db: AsyncSession, message_id: int, text: str) -> None:
    """Replace a message's text (the user edited it)."""
    await db.execute(update(Message).where(Message.id == message_id).values(text=text))


async def delete_message(db: AsyncSession, message_id: int) -> None:
    """Delete one message; its votes and outbox rows go with it."""
    await db.execute(delete(Vote).where(Vote.message_id == message_id))
    await db.execute(delete(Outbox).where(Outbox.message_id == message_id))
    await db.execute(delete(Message).where(Message.id == message_id))


# --- whole chats ---------------------------------------------------------------------------


async def delete_chat(
    db: AsyncSession, chat_id: int, keep_after_update_id: int | None = None
) -> int:
    """Delete every row that mentions a chat; returns how many sessions went.

    With `keep_after_update_id` (a user's /forget), updates that arrived after that one and are
    still waiting are kept: they were sent after the /forget and are still owed an answer.
    """
    await db.execute(delete(Outbox).where(Outbox.chat_id == chat_id))
    await db.execute(delete(Vote).where(Vote.chat_id == chat_id))
    await db.execute(delete(ArenaMatch).where(ArenaMatch.chat_id == chat_id))
    await db.execute(delete(Rating).where(Rating.chat_id == chat_id))
    await db.execute(delete(Assignment).where(Assignment.chat_id == chat_id))
    await db.execute(delete(ChatSetting).where(ChatSetting.chat_id == chat_id))
    # When it was last refused (a chat not allowed); an operator's `admin access` rules that
    # name the chat stay: they are the operator's, not the chat's data.
    await db.execute(delete(AccessRefusal).where(AccessRefusal.chat_id == chat_id))
    await db.execute(delete(Message).where(Message.chat_id == chat_id))
    result = await db.execute(delete(Session).where(Session.chat_id == chat_id))
    inbox = delete(Inbox).where(Inbox.chat_id == chat_id)
    if keep_after_update_id is not None:
        inbox = inbox.where(
            ~((Inbox.status == InboxStatus.PENDING) & (Inbox.update_id > keep_after_update_id))
        )
    await db.execute(inbox)
    return int(getattr(result, "rowcount", 0) or 0)
