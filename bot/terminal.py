"""`python -m bot chat`: the same store, agent cache and batcher, driven from a terminal.

Lines starting with `/` are commands (the command table's, bot/commands.py; /quit; and the
feedback that Telegram gives as buttons: /good and /bad on the last reply, /rate N on the
conversation /done ended); anything else is a turn. Replies go through the outbox like on
Telegram, so the database ends up the same. With STREAM_REPLIES=on and a terminal for output,
the reply grows on one line while it generates (the drafts a private Telegram chat gets), then
the stored reply replaces it; output to a file or a pipe gets only the stored reply, without
escape sequences.

`--lang CODE` plays the part of a Telegram client's language: the bot speaks it unless /lang
chose another for the chat (the model's replies stay in the model's language).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TextIO

from bot.commands import COMMANDS, MENU
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.turn import CommandCall, Drafts, Turn
from bot.conversations.usecases import COMMAND_NAMES, UseCases
from bot.db import outbox
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import OutboxKind

log = logging.getLogger(__name__)

# The table's commands (bot/commands.py) with a use case every front end runs, less those whose
# answer needs Telegram's buttons; /quit and the stand-ins for the feedback buttons (/good,
# /bad, /rate N) are the terminal's own.
TERMINAL_COMMANDS = frozenset(c.name for c in COMMANDS if c.name in COMMAND_NAMES and not c.buttons)
# Advertised when the chat starts: the command menu's, in its order.
ADVERTISED = " ".join(f"/{c.name}" for c in MENU if c.name in TERMINAL_COMMANDS)


class GrowingLine:
    """The draft of the reply in progress, rewritten in place on one line."""

    def __init__(self, out: TextIO, width: int = 100) -> None:
        self.out = out
        self.width = width
        self.shown = False

    def __call__(self, text: str) -> None:
        line = "bot… " + " ".join(text.split())
        if len(line) > self.width:
            line = "bot… …" + line[len(line) - self.width + 6 :]
        self.out.write("\r\033[K" + line)
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        """Remove the draft line (the stored reply is printed in its place)."""
        if self.shown:
            self.out.write("\r\033[K")
            self.out.flush()
            self.shown = False


async def dispatch(
    cases: UseCases,
    chat_id: int,
    line: str,
    drafts: GrowingLine | None = None,
    language: str | None = None,
) -> bool:
    """Act on one input line (`language`: the user's, as `--lang` gave it); False when the
    user asked to quit."""
    text = line.strip()
    if not text:
        return True
    texts = await cases.languages.texts_for(chat_id, language)
    # The terminal's user is its chat; it has no inbox row to close and counts no outcome.
    turn = Turn(chat_id=chat_id, user_id=chat_id, texts=texts)
    if text.startswith("/"):
        command, _, argument = text[1:].partition(" ")
        command = command.lower()
        if command in ("quit", "exit"):
            return False
        if command in TERMINAL_COMMANDS:
            call = CommandCall(command, argument, sender_language=language)
            await cases.command(turn, call)
            if command == "done" and cases.core.settings.feedback_buttons:
                await cases.core.notice(turn, texts.TERMINAL_RATE_HINT)
        elif command in ("good", "bad"):
            vote = 1 if command == "good" else -1
            await cases.votes.vote(turn, chat_id, None, vote, answer_in_chat=True)
        elif command == "rate":
            value = argument.strip()
            if value not in ("1", "2", "3", "4", "5"):
                await cases.core.notice(turn, texts.RATE_USAGE)
            else:
                await cases.votes.rate(turn, None, int(value), answer_in_chat=True)
        else:
            await cases.core.notice(turn, texts.unknown_terminal_command(command))
        return True
    turn.drafts = Drafts(drafts) if drafts is not None else None
    await cases.chat.text(turn, text)
    if drafts is not None:
        drafts.clear()
    return True


async def deliver(store: ConversationStore, chat_id: int, out: TextIO) -> None:
    """Print what the outbox holds for this chat and mark it sent."""
    async with store.read() as db:
        rows = await outbox.pending(db, chat_id)
    for row in rows:
        prefix = "bot> " if row.kind == OutboxKind.REPLY else "** "
        out.write(prefix + row.text.replace("\n", "\n" + " " * len(prefix)) + "\n")
        out.flush()
        async with store.write() as db:
            await outbox.sent(db, row.id)


async def run_terminal(
    settings: Settings,
    *,
    chat_id: int,
    language: str | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Chat until EOF or /quit; returns the exit status."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    from bot.db import migrate
    from bot.engine.router import VariantResponder
    from bot.logs import settings_secrets

    await asyncio.to_thread(migrate.upgrade, settings.db_url)
    db = make_engine(settings.db_url)
    store = ConversationStore(make_sessionmaker(db))
    responder = await VariantResponder.start(settings, store, tuple(settings_secrets(settings)))
    cases = UseCases(store, responder, settings)
    await cases.core.safety.warm_up()
    interactive = stdin.isatty()
    # Redrawing a line needs a terminal: in a file the escape sequences would be litter.
    streams = settings.stream_replies and responder.abilities.drafts and stdout.isatty()
    drafts = GrowingLine(stdout) if streams else None
    try:
        if interactive:
            stdout.write(f"Chat {chat_id}. Commands: {ADVERTISED} /quit.\n")
        await deliver(store, chat_id, stdout)  # anything left from an earlier run
        while True:
            if interactive:
                stdout.write("you> ")
                stdout.flush()
            line = await asyncio.to_thread(stdin.readline)
            if not line:
                break
            if not await dispatch(cases, chat_id, line, drafts, language):
                break
            await deliver(store, chat_id, stdout)
    finally:
        await responder.close()
        await db.dispose()
    return 0
