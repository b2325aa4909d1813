"""Votes on replies and ratings of conversations. Functions take an AsyncSession, never commit."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import Message, Rating, Role, Session, SessionStatus, Vote, VoteSource, utcnow


class Outcome(StrEnum):
    """What became of a vote or a rating."""

    STORED = "stored"  # new, or a vote changed
    UNCHANGED = "unchanged"  # the same vote again
    REMOVED = "removed"  # a reaction taken back
    STALE = "stale"  # no such reply / conversation in this chat (forgotten, forged, not ours)
    TWICE = "twice"  # a second rating of one conversation: the first one stays


@dataclass(frozen=True, slots=True)
class BotReply:
    """The bot reply a vote is about."""

    id: int
    chat_id: int
    variant: str | None
    telegram_message_id: int | None
    variant_version: int | None = None  # the variant's identity (copied to the vote)


REPLY_COLUMNS = (
    Message.id,
    Message.chat_id,
    Message.variant,
    Message.telegram_message_id,
    Message.variant_version,
)


async def bot_reply(db: AsyncSession, chat_id: int, message_id: int) -> BotReply | None:
    """The chat's bot reply with this (database) id; None if it is not one."""
    row = (
        await db.execute(
            select(*REPLY_COLUMNS).where(
                Message.id == message_id, Message.chat_id == chat_id, Message.role == Role.BOT
            )
        )
    ).first()
    return None if row is None else BotReply(*row)


async def bot_reply_by_telegram_id(
    db: AsyncSession, chat_id: int, telegram_message_id: int
) -> BotReply | None:
    """The chat's bot reply Telegram knows by `telegram_message_id` (for reactions)."""
    row = (
        await db.execute(
            select(*REPLY_COLUMNS)
            .where(
                Message.chat_id == chat_id,
                Message.role == Role.BOT,
                Message.telegram_message_id == telegram_message_id,
            )
            .order_by(Message.id.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else BotReply(*row)


async def latest_bot_reply(db: AsyncSession, chat_id: int) -> BotReply | None:
    """The chat's newest bot reply (the terminal chat's /good and /bad)."""
    row = (
        await db.execute(
            select(*REPLY_COLUMNS)
            .where(Message.chat_id == chat_id, Message.role == Role.BOT)
            .order_by(Message.id.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else BotReply(*row)


async def vote(
    db: AsyncSession,
    reply: BotReply,
    user_id: int,
    value: int,
    source: VoteSource,
    update_id: int | None,
) -> Outcome:
    """Store (or change) `user_id`'s vote on `reply`."""
    current = await db.scalar(
        select(Vote.value).where(Vote.message_id == reply.id, Vote.user_id == user_id)
    )
    if current == value:
        return Outcome.UNCHANGED
    if current is not None:
        await db.execute(
            update(Vote)
            .where(Vote.message_id == reply.id, Vote.user_id == user_id)
            .values(value=value, source=source, update_id=update_id, updated_at=utcnow())
        )
        return Outcome.STORED
    now = utcnow()
    await insert_unless_present(
        db,
        Vote,
        {
            "chat_id": reply.chat_id,
            "message_id": reply.id,
            "user_id": user_id,
            "value": value,
            "source": source,
            "variant": reply.variant,
            "variant_version": reply.variant_version,
            "update_id": update_id,
            "created_at": now,
            "updated_at": now,
        },
        ["message_id", "user_id"],
    )
    return Outcome.STORED


async def unvote(db: AsyncSession, reply: BotReply, user_id: int, source: VoteSource) -> Outcome:
    """Take back a vote of this source (a reaction removed)."""
    result = await db.execute(
        delete(Vote).where(
            Vote.message_id == reply.id, Vote.user_id == user_id, Vote.source == source
        )
    )
    return Outcome.REMOVED if getattr(result, "rowcount", 0) else Outcome.UNCHANGED


async def rate(
    db: AsyncSession,
    chat_id: int,
    session_id: int,
    user_id: int | None,
    value: int,
    update_id: int | None,
) -> Outcome:
    """Store the one rating of a conversation of this chat."""
    row = (
        await db.execute(select(Session.chat_id, Session.status).where(Session.id == session_id))
    ).first()
    # Only a conversation of this chat that /done ended carries the rating buttons.
    if row is None or row.chat_id != chat_id or row.status != SessionStatus.DONE:
        return Outcome.STALE
    # The variant identity that answered most of the conversation (ties: the first name, its
    # newest identity).
    answered = (
        await db.execute(
            select(Message.variant, Message.variant_version)
            .where(Message.session_id == session_id, Message.variant.is_not(None))
            .group_by(Message.variant, Message.variant_version)
            .order_by(func.count().desc(), Message.variant, Message.variant_version.desc())
            .limit(1)
        )
    ).first()
    variant, version = (None, None) if answered is None else answered
    new = await insert_unless_present(
        db,
        Rating,
        {
            "chat_id": chat_id,
            "session_id": session_id,
            "user_id": user_id,
            "value": value,
            "variant": variant,
            "variant_version": version,
            "update_id": update_id,
            "created_at": utcnow(),
        },
        ["session_id"],
    )
    return Outcome.STORED if new else Outcome.TWICE


async def latest_ended_session(db: AsyncSession, chat_id: int) -> int | None:
    """The chat's most recently ended conversation (the terminal chat's /rate)."""
    found: int | None = await db.scalar(
        select(Session.id)
        .where(Session.chat_id == chat_id, Session.status == SessionStatus.DONE)
        .order_by(Session.id.desc())
        .limit(1)
    )
    return found
