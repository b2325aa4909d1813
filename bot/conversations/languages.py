"""The language use cases: the texts an update is answered in, and /lang, which shows the
chat's language, sets one for the chat, or goes back to each sender's Telegram language."""

from __future__ import annotations

from bot import texts
from bot.conversations.core import Core, FeatureCommand
from bot.conversations.turn import Turn
from bot.texts import Texts


class Languages:
    """The chat's language."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def texts_for(self, chat_id: int, sender_language: str | None) -> Texts:
        """The texts an update of this chat is answered in: the chat's /lang setting, else
        the sender's Telegram language (`language_code`), else English."""
        stored = await self.core.store.chat_language(chat_id)
        return texts.for_language(texts.choose(stored, sender_language))

    async def language(self, turn: Turn, argument: str, *, sender_language: str | None) -> None:
        """/lang shows the chat's language and the choices, /lang CODE sets it for the chat,
        /lang auto goes back to each sender's Telegram language."""
        store = self.core.store
        word = argument.strip()
        if not word:
            chosen = await store.chat_language(turn.chat_id) is not None
            await self.core.notice(turn, turn.texts.language_shown(chosen))
            return
        if word.lower() == "auto":
            now = texts.for_language(texts.choose(None, sender_language))
            await store.set_language(
                turn.chat_id, None, notice=now.language_auto(), update=turn.update
            )
            return
        language = texts.normalize(word)
        if language is None:
            await self.core.notice(turn, turn.texts.language_unknown(word))
            return
        # The confirmation is the first sentence in the language just chosen.
        chosen_texts = texts.for_language(language)
        await store.set_language(
            turn.chat_id, language, notice=chosen_texts.language_set(), update=turn.update
        )


# The commands of the table (bot/commands.py) this feature runs.
COMMANDS: dict[str, FeatureCommand[Languages]] = {
    "lang": lambda languages, turn, call: languages.language(
        turn, call.argument, sender_language=call.sender_language
    ),
}
