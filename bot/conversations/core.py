"""The shared core of the conversation use cases (bot/conversations/usecases.py): what every
feature's use case needs, the store, the responder, the settings, the safety gate, and the
answers every feature gives alike (a notice, a message kept without a reply).

Every outcome is written to the outbox in the same transaction that changes the conversation;
front ends only deliver what the outbox holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from bot import texts
from bot.config import Settings
from bot.conversations.outcome import FLOODED
from bot.conversations.store import ConversationStore
from bot.conversations.turn import CommandCall, Turn
from bot.engine.protocol import ResponderProtocol
from bot.safety import SafetyGate

F = TypeVar("F")
# A command's use case: what a front end runs for `/name argument` (bot/commands.py).
UseCase = Callable[[Turn, CommandCall], Awaitable[None]]
# A feature's use case of a command, on the feature's object: each feature module's COMMANDS
# maps the commands of the table it owns to these.
FeatureCommand = Callable[[F, Turn, CommandCall], Awaitable[None]]


def storable(text: str) -> str:
    """The text without U+0000, which PostgreSQL cannot store in a text column.

    No Telegram client sends it on purpose; it is dropped on both backends alike, so a
    conversation reads the same wherever it is stored. Every other character is kept.
    """
    return text.replace("\x00", "")


def clean_text(text: str) -> str:
    """Drop U+0000 and strip surrounding whitespace; inner text is kept verbatim."""
    return storable(text).strip()


@dataclass(eq=False)
class Core:
    """What the use cases of one service share; each use case ends in exactly one
    transaction."""

    store: ConversationStore
    responder: ResponderProtocol
    settings: Settings
    safety: SafetyGate = field(init=False)

    def __post_init__(self) -> None:
        self.safety = SafetyGate(
            self.settings.safety,
            self.settings.safety_threshold,
            # It stands in for a model reply and the model reads it back: the model's language.
            deflection=texts.for_language(self.settings.bot_model_language).DEFLECTION,
        )

    async def notice(self, turn: Turn, text: str) -> None:
        """Send a short message that is not part of the conversation, and close the update."""
        await turn.end_drafts()
        await self.store.notice(turn.chat_id, text, update=turn.update)

    async def fits(self, turn: Turn, text: str) -> bool:
        """Whether a message is within MESSAGE_MAX_CHARS; one that is not gets the notice."""
        limit = self.settings.message_max_chars
        if len(text) <= limit:
            return True
        await self.notice(turn, turn.texts.message_too_long(len(text), limit))
        return False

    async def unanswered(
        self,
        turn: Turn,
        text: str,
        *,
        notice: str | None,
        telegram_message_id: int | None = None,
    ) -> None:
        """Keep a user message without a model reply (flood limit); it joins the next turn."""
        await turn.end_drafts()
        text = storable(text)
        session = await self.store.active_session(turn.chat_id, turn.user_id)
        await self.store.record_user_message(
            session.id,
            turn.chat_id,
            text,
            update=turn.update,
            telegram_message_id=telegram_message_id,
            notice=notice,
        )
        # The cached clone has not seen this message; rebuilding it from the database will.
        self.responder.evict(session.id)
        turn.decided(FLOODED)
