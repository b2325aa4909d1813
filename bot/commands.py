"""The command table: the one list that Telegram's handlers, the command menu (setMyCommands,
in every language), /help and the terminal chat's commands are derived from. A new command is
one entry here, its use case (in its feature's module of bot/conversations/: a method and its
line in that module's COMMANDS, which both front ends run through UseCases.command) and its
sentences (bot/texts, with their translations in the catalogs).

Descriptions are English msgids, marked with N_ for extraction and translated where shown
(bot.texts.Texts.translate); the table itself holds no language.
"""

from __future__ import annotations

from dataclasses import dataclass


def N_(message: str) -> str:
    """Mark a message for the catalogs without translating it here."""
    return message


# The example persona of /help and /persona: the model reads a persona, so it is shown in the
# model's language (BOT_MODEL_LANGUAGE's catalog; English, the source, where there is none),
# whatever language the chat reads.
EXAMPLE_PERSONA = N_("My name is Sarah. I love hiking.")


@dataclass(frozen=True, slots=True)
class Usage:
    """One line of /help: `/name <args>` - `text`. The text may name `{model_language}`, the
    language the model understands (BOT_MODEL_LANGUAGE), in the chat's language."""

    text: str
    args: str = ""
    # The args are an example the model reads (EXAMPLE_PERSONA), shown in the model's
    # language, not a keyword the bot reads ("clear").
    example: bool = False


@dataclass(frozen=True, slots=True)
class Command:
    """A command the bot answers to."""

    name: str
    # The command menu's description (at most 256 characters); None: not advertised (the
    # admins' /stats, and /model and /arena, which only some operators turn on).
    menu: str | None
    # Its lines in /help (in this order); empty: not in /help.
    usage: tuple[Usage, ...] = ()
    # Runs whatever the flood gate says: a user must always be able to delete their data.
    flood_exempt: bool = False
    # Its answer needs Telegram's inline buttons (the /arena pick): not in the terminal chat.
    buttons: bool = False


COMMANDS: tuple[Command, ...] = (
    Command("start", N_("Say hello and learn how to use me")),
    Command(
        "help",
        N_("How to use me"),
        # /help comes last in /help (see HELP_LAST); its line is kept here with the command.
        (Usage(N_("this message")),),
    ),
    Command(
        "persona",
        N_("Show my persona; /persona <text> sets it, /persona clear clears it"),
        (
            Usage(N_("show my current persona")),
            Usage(
                N_("set who I am (one or more sentences; the model understands {model_language})"),
                EXAMPLE_PERSONA,
                example=True,
            ),
            Usage(N_("remove the persona"), "clear"),
        ),
    ),
    Command(
        "done",
        N_("End this conversation (my persona stays)"),
        (Usage(N_("end this conversation and start afresh (the persona stays)")),),
    ),
    Command(
        "forget",
        N_("Delete everything stored about this chat"),
        (Usage(N_("delete everything stored about this chat")),),
        flood_exempt=True,
    ),
    Command(
        "context",
        N_("What I read before my next reply"),
        (Usage(N_("what I read before my next reply")),),
    ),
    Command(
        "privacy",
        N_("What I store, for how long, and how to delete it"),
        (Usage(N_("what I store and how to delete it")),),
        flood_exempt=True,
    ),
    Command(
        "lang",
        N_("Show or choose my language; /lang auto follows Telegram's"),
        (
            Usage(N_("show my language and the choices")),
            Usage(N_("speak German in this chat"), "de"),
            Usage(N_("follow each sender's Telegram language again"), "auto"),
        ),
    ),
    Command("stats", None),
    Command("model", None),
    Command("arena", None, buttons=True),
)

BY_NAME = {command.name: command for command in COMMANDS}
# Shown in the command menu, in table order.
MENU = tuple(c for c in COMMANDS if c.menu is not None)
# Commands a bare "/name" in a group may mean us by.
KNOWN = frozenset(BY_NAME)
FLOOD_EXEMPT = frozenset(c.name for c in COMMANDS if c.flood_exempt)
# The order of /help: the table's, with /help itself at the end.
HELP_LAST = "help"
