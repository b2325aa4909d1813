"""The language use cases: the texts an update is answered in, and /lang, which shows the
chat's language, sets one for the chat, or goes back to each sender's Telegram language."""

from __future__ import annotations

from bot import texts
from bot.conversations.core import Core, FeatureCommand
from bot.conversations.store import answer
from bot.conversations.turn import Turn
from bot.db import chat_settings
from bot.texts import Texts


class Languages:
    """The chat's language."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def texts_for(self, chat_id: int, sender_language: str | None) -> Texts:
        """The texts an update of this chat is answered in: the chat's /lang setting, else
        the sender's Telegram language (`language_code`), else English."""
        return texts.for_language(texts.choose(await self._stored(chat_id), sender_language))

    async def _stored(self, chat_id: int) -> str | None:
        """The language the chat chose with /lang (None: each sender's Telegram language)."""
        async with self.core.store.read() as db:
            return await chat_settings.language_of(db, chat_id)

    async def _set(self, turn: Turn, language: str | None, notice: str) -> None:
        """Store the chat's language (/lang CODE; None: /lang auto), confirming it, in one
        transaction that closes the update."""
        async with self.core.store.write() as db:
            await chat_settings.set_language(db, turn.chat_id, language)
            await answer(db, turn.chat_id, notice, turn.update)

    async def language(self, turn: Turn, argument: str, *, sender_language: str | None) -> None:
        """/lang shows the chat's language and the choices, /lang CODE sets it for the chat,
        /lang auto goes back to each sender's Telegram language."""
        word = argument.strip()
        if not word:
            chosen = await self._stored(turn.chat_id) is not None
            await self.core.notice(turn, turn.texts.language_shown(chosen))
            return
        if word.lower() == "auto":
            now = texts.for_language(texts.choose(None, sender_language))
            await self._set(turn, None, now.language_auto())
            return
        language = texts.normalize(word)
        if language is None:
            await self.core.notice(turn, turn.texts.language_unknown(word))
            return
        # The confirmation is the first sentence in the language just chosen.
        chosen_texts = texts.for_language(language)
        await self._set(turn, language, chosen_texts.language_set())


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[Languages]] = {
    "lang": lambda languages, turn, call: languages.language(
        turn, call.argument, sender_language=call.sender_language
    ),
}
