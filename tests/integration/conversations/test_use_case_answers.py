"""What the shared use cases (bot/conversations/usecases.py) answer to awkward input, run
through UseCases on a real store: an echoed argument stays a short excerpt, a command the
operator has not enabled gets one wording, and /good or /bad with nothing to rate get one
answer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bot.commands import BY_NAME
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.turn import CommandCall, Turn
from bot.conversations.usecases import UseCases
from bot.engine.protocol import Abilities
from bot.engine.variants import Experiment, Variant
from bot.service.delivery import split_message
from bot.terminal import dispatch as terminal_dispatch
from bot.texts import ENGLISH, LANGUAGES, for_language
from tests.support.service_harness import EchoResponder
from tests.support.store_rows import pending_outbox


class VariantsEcho(EchoResponder):
    """An echo responder that serves two variants (what /model lists), without a duel."""

    experiment = Experiment("default", (Variant("a", "m", control=True), Variant("b", "m")))

    @property
    def abilities(self) -> Abilities:
        return Abilities(drafts=True, variants=SimpleNamespace(experiment=self.experiment))  # type: ignore[arg-type]


def actions(
    store: ConversationStore, tmp_path: Path, responder: EchoResponder | None = None, **more: Any
) -> UseCases:
    settings = Settings(_env_file=None, data_dir=tmp_path, safety="off", **more)  # type: ignore[call-arg]
    return UseCases(store, responder or EchoResponder(), settings)


async def run(
    chat: UseCases, chat_id: int, name: str, argument: str = "", language: str = "en"
) -> list[str]:
    """Run a command's use case as a front end does; returns what it queued for the chat."""
    turn = Turn(chat_id=chat_id, user_id=chat_id, texts=for_language(language))
    await chat.command(turn, CommandCall(name, argument))
    return [row.text for row in await pending_outbox(chat.core.store, chat_id)]


# --- item 4: echoed arguments ------------------------------------------------------------------

ZERO_WIDTH = "\u200b" * 4000  # one Telegram message of zero-width spaces
ARGUMENTS = {
    "zero-width": ZERO_WIDTH,
    "zero-width around a word": ZERO_WIDTH[:2000] + "xx" + ZERO_WIDTH[:2000],
    "long": "x" * 4000,
    "control characters": "\x07\x1b[31m" * 500,
    "right-to-left marks": "\u202e\u2066ab" * 1000,
}


async def test_an_echoed_argument_is_a_short_printable_excerpt_in_one_message(
    store: ConversationStore, tmp_path: Path
) -> None:
    # Before: `{code!r}` echoed the whole argument; 4,000 zero-width spaces became a notice of
    # 24,128 characters that delivery split into 6 messages.
    personas = tmp_path / "personas.toml"
    personas.write_text('[presets]\nsarah = "My name is Sarah."\n', encoding="utf-8")
    chat = actions(store, tmp_path, VariantsEcho(), allow_model_choice=True, personas_file=personas)
    chat_id = 0
    for language in LANGUAGES:
        for name, prefix in (("lang", ""), ("model", ""), ("persona", "use ")):
            for what, argument in ARGUMENTS.items():
                chat_id += 1
                [notice] = await run(chat, chat_id, name, prefix + argument, language)
                case = f"/{name} {prefix}<{what}> in {language}: {notice[:300]!a}"
                assert len(split_message(notice)) == 1, case
                assert len(notice) < 300, case
                assert notice.isprintable(), case


def test_excerpt_keeps_short_printable_text_and_caps_the_rest() -> None:
    from bot.texts import excerpt

    assert excerpt("de-CH") == "de-CH"
    assert excerpt("Привет, мир") == "Привет, мир"
    assert excerpt("\u200b" * 4000) == ""
    assert excerpt("a\u200bb\n\tc") == "ab c"
    assert excerpt("x" * 4000) == "x" * 32 + "…"
    assert excerpt("x" * 32) == "x" * 32


# --- item 9: one refusal for every command that can be off ------------------------------------

# The commands an operator turns on (bot/commands.py: not in the menu, and not the admins' own).
CAN_BE_OFF = [c.name for c in BY_NAME.values() if c.menu is None and c.name != "stats"]


def test_the_commands_that_can_be_off_are_model_and_arena() -> None:
    assert sorted(CAN_BE_OFF) == ["arena", "model"]


async def test_every_command_that_is_not_enabled_gets_the_same_refusal(
    store: ConversationStore, tmp_path: Path
) -> None:
    # Before: a disabled /model said "I don't know that command", a disabled /arena "Arena
    # mode is not available here".
    chat_id = 100
    # No variants at all; then variants, but neither ALLOW_MODEL_CHOICE nor ARENA.
    for responder in (EchoResponder(), VariantsEcho()):
        chat = actions(store, tmp_path, responder)
        for language in LANGUAGES:
            texts = for_language(language)
            for name, argument in [(name, "") for name in CAN_BE_OFF] + [("model", "a")]:
                chat_id += 1
                assert await run(chat, chat_id, name, argument, language) == [
                    texts.not_enabled(name)
                ]
            assert texts.not_enabled("model") != texts.UNKNOWN_COMMAND
            assert texts.not_enabled("model").replace("/model", "/arena") == texts.not_enabled(
                "arena"
            )


# --- item 8: /good and /bad before any reply ----------------------------------------------------


@pytest.mark.parametrize("command", ["/good", "/bad"])
async def test_a_vote_with_no_reply_to_rate_gets_only_the_nothing_to_rate_answer(
    store: ConversationStore, tmp_path: Path, command: str
) -> None:
    # Before: "Thanks, noted. I'll try to do better." and then "There is no reply of mine to
    # rate yet." The thanks were queued with the vote before it was known to be stale.
    chat = actions(store, tmp_path)
    await terminal_dispatch(chat, 21, command)
    assert [row.text for row in await pending_outbox(store, 21)] == [ENGLISH.NOTHING_TO_VOTE_ON]
    # With a reply to rate, the thanks alone.
    await terminal_dispatch(chat, 22, "hello")
    await terminal_dispatch(chat, 22, command)
    thanks = ENGLISH.VOTED_UP if command == "/good" else ENGLISH.VOTED_DOWN
    assert [row.text for row in await pending_outbox(store, 22)] == ["echo 22: hello", thanks]
