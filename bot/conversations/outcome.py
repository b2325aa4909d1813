"""A turn's outcome, as the use case decided it: what bot_turns_total counts.

The outcome is decided deep in the use cases (ChatActions) but counted by the inbox worker's
runner (bot/service), once per update, after its handler returned: `note_turn` leaves the
outcome (and the replies it produced) in a context variable for the runner to pick up. So a
retried attempt never counts twice, an update counts exactly once, and the terminal chat, which
has no runner, counts nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from bot.engine.protocol import Reply

# bot_turns_total's outcomes (README: Metrics and health).
REPLIED = "replied"  # a model reply stored and queued (a text, or an edit's new reply)
ARENA = "arena"  # two variants' replies to one message (/arena)
NO_REPLY = "no_reply"  # generation failed; the message is kept, the chat told so
FLOODED = "flooded"  # over the chat's flood limit: not answered by the model
COMMAND = "command"  # a command answered
FEEDBACK = "feedback"  # a 👍/👎 press or reaction, a rating, an arena pick
NOTICE = "notice"  # any other update answered with a notice (a sticker, an old edit, ...)
IGNORED = "ignored"  # closed without an answer (not for the bot, a service message)
FAILED = "failed"  # its handler failed every attempt; the chat got the apology
OUTCOMES = (REPLIED, ARENA, NO_REPLY, FLOODED, COMMAND, FEEDBACK, NOTICE, IGNORED, FAILED)


@dataclass
class TurnNote:
    """What the use case decided for the update being processed."""

    outcome: str | None = None
    variant: str = ""
    replies: list[Reply] = field(default_factory=list)


_turn: ContextVar[TurnNote | None] = ContextVar("turn_note", default=None)


@contextlib.contextmanager
def turn_scope() -> Iterator[TurnNote]:
    """The note of one update's processing (the inbox worker's runner opens it)."""
    note = TurnNote()
    token = _turn.set(note)
    try:
        yield note
    finally:
        _turn.reset(token)


def note_turn(outcome: str, variant: str | None = None, replies: Sequence[Reply] = ()) -> None:
    """Record the outcome of the update being processed (no-op outside a turn scope, e.g. in
    the terminal chat); the last note of an update wins."""
    note = _turn.get()
    if note is not None:
        note.outcome = outcome
        note.variant = variant or ""
        note.replies = list(replies)
