"""The command table (bot/commands.py) is the one place a command is declared: every entry has
one use case both front ends run, or is one front end's own; the terminal derives its commands
from it."""

from __future__ import annotations

from bot import commands, terminal
from bot.conversations import chat, languages, model_choice, personas, votes
from bot.conversations.turn import CommandCall
from bot.conversations.usecases import COMMAND_NAMES

# Telegram's own commands: /stats reads the admin reports, a layer above the use cases.
TELEGRAM_ONLY = {"stats"}


def test_every_command_has_one_use_case_or_is_telegrams_own() -> None:
    names = {c.name for c in commands.COMMANDS}
    assert names == COMMAND_NAMES | TELEGRAM_ONLY
    assert not COMMAND_NAMES & TELEGRAM_ONLY
    assert len(names) == len(commands.COMMANDS)  # no name twice
    # Each command is one feature's: no two features run the same one.
    features = (chat, personas, votes, model_choice, languages)
    assert sum(len(feature.COMMANDS) for feature in features) == len(COMMAND_NAMES)


def test_the_terminal_runs_the_table_less_what_needs_buttons() -> None:
    buttons = {c.name for c in commands.COMMANDS if c.buttons}
    assert buttons == {"arena"}
    assert COMMAND_NAMES - buttons == terminal.TERMINAL_COMMANDS
    # The startup line advertises the menu's commands, in the menu's order.
    assert terminal.ADVERTISED.split() == [
        f"/{c.name}" for c in commands.MENU if c.name in terminal.TERMINAL_COMMANDS
    ]
    assert terminal.ADVERTISED.startswith("/start /help /persona /done")


def test_a_command_call_keeps_its_argument_verbatim() -> None:
    call = CommandCall("persona", "Line one.\nLine two.", sender_language="de")
    assert (call.name, call.argument, call.sender_language) == (
        "persona",
        "Line one.\nLine two.",
        "de",
    )
    assert call.rating_markup is None
