"""One turn: the update being processed, handed from the front end to every use case.

The runner that takes an update (bot/tg/runner.UpdateRunner for Telegram, the terminal chat
for a line typed) makes one Turn and passes it down; nothing of a turn travels in a context
variable (only the log fields do, bot/logs.py). A Turn carries:

- what the update is: its id (None in the terminal, which has no inbox), chat, user, the time
  it was received, and the texts it is answered in;
- who may close it: `owner`, the replica holding the chat's inbox lease, checked again in the
  commit that closes the update (bot.db.inbox.finish), so a replica that lost the chat to
  another one meanwhile cannot commit its turn;
- where its drafts go: the front end that can show a reply growing (Telegram's
  `sendMessageDraft` in private chats, the terminal's one line) sets `drafts`; the use case
  hands `draft_sink` to the responder and awaits `end_drafts()` before anything of the turn is
  written to the outbox (any replica may send a committed row at once, so this is the one
  point where a draft can still be kept from reaching the chat after the reply; docs/guarantees.md,
  invariant 12);
- what the use case decided: `decided(outcome, variant, replies)`, read by the runner once
  the update is closed (bot_turns_total, bot/conversations/outcome.py), so a retried attempt
  never counts twice and the terminal, which counts nothing, just ignores it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bot.db.inbox import UpdateRef
from bot.engine.protocol import DraftSink, Reply
from bot.texts import ENGLISH, Texts

DraftsDone = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Drafts:
    """Where a turn's drafts go, and how to stop them (and wait for one still in flight)."""

    sink: DraftSink
    done: DraftsDone | None = None


@dataclass(frozen=True, slots=True)
class CommandCall:
    """A command of the table (bot/commands.py) as a front end received it, for
    UseCases.command: the same use case runs for Telegram and the terminal."""

    name: str
    argument: str = ""  # everything after the command, inner line breaks kept
    # The sender's client language (Telegram's language_code, the terminal's --lang).
    sender_language: str | None = None
    # A front end's 1-5 rating keyboard for a session id (/done); None: it shows none.
    rating_markup: Callable[[int], str] | None = None


@dataclass(eq=False, slots=True)
class Turn:
    """One update being processed (see the module's docstring)."""

    chat_id: int
    update_id: int | None = None  # None: no inbox row to close (the terminal chat)
    user_id: int | None = None
    at: datetime | None = None  # when the update was received
    texts: Texts = ENGLISH
    owner: str | None = None  # the inbox lease's holder; None: no lease to check
    drafts: Drafts | None = None
    # What the use case decided (the last decision of an attempt wins).
    outcome: str | None = None
    variant: str = ""
    replies: list[Reply] = field(default_factory=list)

    @property
    def update(self) -> UpdateRef | None:
        """The inbox row this turn closes, fenced by its lease (None: nothing to close)."""
        return UpdateRef(self.update_id, self.owner) if self.update_id is not None else None

    @property
    def draft_sink(self) -> DraftSink | None:
        """Where the responder sends drafts of the reply (None: the front end shows none)."""
        return self.drafts.sink if self.drafts is not None else None

    async def end_drafts(self) -> None:
        """No more drafts in this turn, and none in flight: its reply (or notice) is next."""
        if self.drafts is not None and self.drafts.done is not None:
            await self.drafts.done()

    def decided(
        self, outcome: str, variant: str | None = None, replies: Sequence[Reply] = ()
    ) -> None:
        """Record the turn's outcome (bot/conversations/outcome.py) and the replies made."""
        self.outcome = outcome
        self.variant = variant or ""
        self.replies = list(replies)
