"""Arena matches (/arena): two variants' replies to one message, and which one the user picked.
Functions take an AsyncSession, never commit."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db import conversations, variants
from bot.db.feedback import Outcome
from bot.db.models import ArenaMatch, Message, Role, Session, utcnow

WINNERS = ("a", "b", "tie")


@dataclass(frozen=True, slots=True)
class Decided:
    """What a pick did."""

    outcome: Outcome
    session_id: int | None = None
    # The bot message the chosen reply became (None: both were bad, or nothing changed).
    bot_message_id: int | None = None


async def requested(db: AsyncSession, session_id: int) -> int | None:
    """The session's arena request still waiting for its message, if any."""
    found: int | None = await db.scalar(
        select(ArenaMatch.id).where(
            ArenaMatch.session_id == session_id, ArenaMatch.user_message_id.is_(None)
        )
    )
    return found


async def request(db: AsyncSession, chat_id: int, session_id: int) -> int:
    """Mark the session's next message for a duel (once: a second /arena changes nothing)."""
    existing = await requested(db, session_id)
    if existing is not None:
        return existing
    match = ArenaMatch(chat_id=chat_id, session_id=session_id)
    db.add(match)
    await db.flush()
    return match.id


async def fill(
    db: AsyncSession,
    match_id: int,
    user_message_id: int,
    pair: tuple[tuple[str | None, str], tuple[str | None, str]],
    persona: str | None = None,
    versions: tuple[int | None, int | None] = (None, None),
) -> None:
    """The duel's message and its two replies, as ((variant_a, text_a), (variant_b, text_b)),
    the persona both were generated with (None: the conversation's persona now), and the
    variants' identities (None: the name's current one, as the duel is stored)."""
    (variant_a, text_a), (variant_b, text_b) = pair
    version_a, version_b = (
        variants.identity_of(name) if version is None and name is not None else version
        for name, version in zip((variant_a, variant_b), versions, strict=True)
    )
    await db.execute(
        update(ArenaMatch)
        .where(ArenaMatch.id == match_id)
        .values(
            user_message_id=user_message_id,
            variant_a=variant_a,
            text_a=text_a,
            variant_b=variant_b,
            text_b=text_b,
            version_a=version_a,
            version_b=version_b,
            persona=persona
            if persona is not None
            else select(Session.persona)
            .where(Session.id == ArenaMatch.session_id)
            .scalar_subquery(),
        )
    )


async def decide(db: AsyncSession, chat_id: int, match_id: int, winner: str) -> Decided:
    """The user's pick; the chosen reply is added to the conversation as the bot's answer."""
    match = await db.get(ArenaMatch, match_id)
    if (
        match is None
        or match.chat_id != chat_id
        or match.user_message_id is None
        or winner not in WINNERS
    ):
        return Decided(Outcome.STALE)
    if match.winner is not None:
        return Decided(Outcome.TWICE, match.session_id)
    bot_message_id = None
    newest = await db.scalar(
        select(Message.id)
        .where(Message.session_id == match.session_id)
        .order_by(Message.id.desc())
        .limit(1)
    )
    if winner != "tie" and newest == match.user_message_id:
        # Only while the duel's message is still the conversation's last one: a reply added
        # after later turns would land out of order (the user moved on; the pick still counts).
        text = match.text_a if winner == "a" else match.text_b
        variant = match.variant_a if winner == "a" else match.variant_b
        version = match.version_a if winner == "a" else match.version_b
        bot_message_id = await conversations.add_message(
            db,
            session_id=match.session_id,
            chat_id=chat_id,
            role=Role.BOT,
            text=text or "",
            # What the model read then, even if the persona changed before the pick.
            facts=conversations.ReplyFacts(
                variant=variant, variant_version=version, persona=match.persona
            ),
        )
    match.winner = winner
    match.decided_at = utcnow()
    match.bot_message_id = bot_message_id
    return Decided(Outcome.STORED, match.session_id, bot_message_id)
