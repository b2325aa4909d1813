"""The persona use cases: /persona shows, sets or clears it, `/persona list` and
`/persona use NAME` the operator's presets (PERSONAS_FILE); /start's deep link takes one too
(bot/conversations/chat.py)."""

from __future__ import annotations

import logging

from bot.conversations.core import Core, FeatureCommand, clean_text
from bot.conversations.turn import Turn
from bot.db import conversations
from bot.presets import load_presets
from bot.safety import SafetyMark

log = logging.getLogger(__name__)

PERSONA_CLEAR_WORDS = {"-", "clear", "none", "off", "reset"}


class Personas:
    """The chat's persona and the operator's presets."""

    def __init__(self, core: Core) -> None:
        self.core = core
        settings = core.settings
        self.presets = load_presets(settings.personas_file, settings.persona_max_chars)

    async def persona(self, turn: Turn, argument: str) -> None:
        """/persona shows, /persona <text> sets, /persona clear clears."""
        if argument.strip():
            await self.set_persona(turn, argument)
        else:
            await self.show_persona(turn)

    async def show_persona(self, turn: Turn) -> None:
        """/persona without text."""
        persona = await self.current(turn.chat_id)
        text = (
            turn.texts.persona_shown(persona)
            if persona
            else turn.texts.no_persona(self.core.settings.bot_model_language)
        )
        await self.core.notice(turn, text)

    async def current(self, chat_id: int) -> str:
        """The persona the next reply of this chat will use (a new conversation keeps the
        previous one's)."""
        async with self.core.store.read() as db:
            active = await conversations.get_active_session(db, chat_id)
            return active.persona if active else await conversations.latest_persona(db, chat_id)

    async def set_persona(self, turn: Turn, text: str) -> None:
        """/persona <text>: set it (or clear it with a clear word); `/persona list` shows the
        presets, `/persona use NAME` takes one."""
        core = self.core
        word, _, rest = text.strip().partition(" ")
        if word.lower() == "list" and not rest.strip():
            listing = (
                turn.texts.presets_list(self.presets.personas) if self.presets.personas else None
            )
            await core.notice(turn, listing or turn.texts.NO_PRESETS)
            return
        if word.lower() == "use" and rest.strip():
            preset = self.presets.get(rest)
            if preset is None:
                unknown = turn.texts.preset_unknown(rest.strip(), self.presets.names)
                await core.notice(turn, unknown)
                return
            text = preset
        persona = clean_text(text)
        if not persona and text.strip():
            await core.notice(turn, turn.texts.PERSONA_EMPTY)
            return
        if persona.lower() in PERSONA_CLEAR_WORDS:
            persona = ""
        limit = core.settings.persona_max_chars
        if len(persona) > limit:
            await core.notice(turn, turn.texts.persona_too_long(len(persona), limit))
            return
        offensive = await core.safety.persona(persona)
        if offensive and core.safety.mode == "block":
            log.info("chat %s: refused an offensive persona", turn.chat_id)
            await core.notice(turn, turn.texts.PERSONA_REFUSED)
            return
        notice = turn.texts.persona_set(persona) if persona else turn.texts.PERSONA_CLEARED
        await self.take(turn, persona, notice, safety=SafetyMark.FLAGGED if offensive else None)

    async def take(
        self, turn: Turn, persona: str, notice: str, *, safety: str | None = None
    ) -> None:
        """Set the chat's persona (confirmed with `notice`) in one transaction, and tell the
        responder."""
        session = await self.core.store.set_persona(
            turn.chat_id, turn.user_id, persona, notice=notice, update=turn.update, safety=safety
        )
        self.core.responder.set_persona(session.id, persona)


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[Personas]] = {
    "persona": lambda personas, turn, call: personas.persona(turn, call.argument),
}
