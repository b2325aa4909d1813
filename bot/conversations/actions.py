"""The conversation use cases every front end shares (Telegram handlers, terminal chat).

Every outcome is written to the outbox in the same transaction that changes the conversation;
front ends only deliver what the outbox holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from bot import texts
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db.conversations import SessionRow

log = logging.getLogger(__name__)

PERSONA_CLEAR_WORDS = {"-", "clear", "none", "off", "reset"}


@dataclass(frozen=True, slots=True)
class Reply:
    """What the responder produced for one turn."""

    text: str
    latency_ms: float


class GenerationError(Exception):
    """Generation failed for this request; the message is safe to log."""


class ResponderProtocol(Protocol):
    """What the conversation layer needs from the model responder."""

    async def respond(self, session: SessionRow, user_text: str) -> Reply:
        """Generate the bot's reply to `user_text` in `session`'s context."""
        ...

    def set_persona(self, session_id: int, persona: str) -> None:
        """Make a cached conversation use a new persona from its next turn."""
        ...

    def evict(self, session_id: int) -> None:
        """Drop a conversation's cached agent (it is rebuilt from the database on demand)."""
        ...

    def turn_stored(self, session_id: int, last_message_id: int) -> None:
        """The turn just generated for a conversation is committed up to `last_message_id`."""
        ...


def storable(text: str) -> str:
    """The text without U+0000, which PostgreSQL cannot store in a text column.

    No Telegram client sends it on purpose; it is dropped on both backends alike, so a
    conversation reads the same wherever it is stored. Every other character is kept.
    """
    return text.replace("\x00", "")


def clean_text(text: str) -> str:
    """Drop U+0000 and strip surrounding whitespace; inner text is kept verbatim."""
    return storable(text).strip()


class ChatActions:
    """User actions of one chat, each ending in exactly one transaction."""

    def __init__(
        self, store: ConversationStore, responder: ResponderProtocol, settings: Settings
    ) -> None:
        self.store = store
        self.responder = responder
        self.settings = settings

    async def notice(self, chat_id: int, text: str, *, update_id: int | None = None) -> None:
        """Send a short message that is not part of the conversation, and close the update."""
        await self.store.notice(chat_id, text, update_id=update_id)

    async def help(
        self, chat_id: int, *, update_id: int | None = None, start: bool = False
    ) -> None:
        """/start and /help."""
        greeting = texts.GREETING if start else ""
        await self.notice(chat_id, greeting + texts.HELP, update_id=update_id)

    async def show_persona(self, chat_id: int, *, update_id: int | None = None) -> None:
        """/persona without text."""
        persona = await self.store.current_persona(chat_id)
        text = texts.persona_shown(persona) if persona else texts.NO_PERSONA
        await self.notice(chat_id, text, update_id=update_id)

    async def set_persona(
        self, chat_id: int, user_id: int | None, text: str, *, update_id: int | None = None
    ) -> None:
        """/persona <text>: set it (or clear it with a clear word)."""
        persona = clean_text(text)
        if not persona and text.strip():
            await self.notice(
                chat_id,
                texts.PERSONA_EMPTY,
                update_id=update_id,
            )
            return
        if persona.lower() in PERSONA_CLEAR_WORDS:
            persona = ""
        limit = self.settings.persona_max_chars
        if len(persona) > limit:
            await self.notice(
                chat_id,
                texts.persona_too_long(len(persona), limit),
                update_id=update_id,
            )
            return
        notice = texts.persona_set(persona) if persona else texts.PERSONA_CLEARED
        session = await self.store.set_persona(
            chat_id, user_id, persona, notice=notice, update_id=update_id
        )
        self.responder.set_persona(session.id, persona)

    async def done(self, chat_id: int, *, update_id: int | None = None) -> None:
        """/done: end the conversation; history stays for admins, the persona carries over."""
        session = await self.store.end_session(
            chat_id,
            notice=texts.ENDED,
            update_id=update_id,
        )
        if session is not None:
            self.responder.evict(session.id)

    async def forget(self, chat_id: int, *, update_id: int | None = None) -> None:
        """/forget: delete everything stored for this chat."""
        active = await self.store.active_session_id(chat_id)
        await self.store.forget_chat(
            chat_id,
            notice=texts.FORGOTTEN,
            update_id=update_id,
        )
        if active is not None:
            self.responder.evict(active)

    async def unanswered(
        self,
        chat_id: int,
        user_id: int | None,
        text: str,
        *,
        notice: str | None,
        update_id: int | None = None,
        telegram_message_id: int | None = None,
    ) -> None:
        """Keep a user message without a model reply (flood limit); it joins the next turn."""
        text = storable(text)
        session = await self.store.active_session(chat_id, user_id)
        await self.store.record_user_message(
            session.id,
            chat_id,
            text,
            update_id=update_id,
            telegram_message_id=telegram_message_id,
            notice=notice,
        )
        # The cached clone has not seen this message; rebuilding it from the database will.
        self.responder.evict(session.id)

    async def text(
        self,
        chat_id: int,
        user_id: int | None,
        text: str,
        *,
        update_id: int | None = None,
        telegram_message_id: int | None = None,
    ) -> None:
        """A plain message: one model turn, stored with its reply in one transaction."""
        text = clean_text(text)
        if not text:
            await self.notice(chat_id, texts.SAY_SOMETHING, update_id=update_id)
            return
        limit = self.settings.message_max_chars
        if len(text) > limit:
            await self.notice(
                chat_id,
                texts.message_too_long(len(text), limit),
                update_id=update_id,
            )
            return
        session = await self.store.active_session(chat_id, user_id)
        try:
            reply = await self.responder.respond(session, text)
        except GenerationError as err:
            log.warning("generation failed for chat %s: %s", chat_id, err)
            self.responder.evict(session.id)
            await self.unanswered(
                chat_id,
                user_id,
                text,
                notice=texts.NO_REPLY,
                update_id=update_id,
                telegram_message_id=telegram_message_id,
            )
            return
        try:
            stored = await self.store.record_turn(
                session.id,
                chat_id,
                text,
                reply.text,
                latency_ms=reply.latency_ms,
                update_id=update_id,
                telegram_message_id=telegram_message_id,
            )
        except BaseException:
            # The clone already heard this turn but the database did not keep it.
            self.responder.evict(session.id)
            raise
        self.responder.turn_stored(session.id, stored.bot_message_id)
