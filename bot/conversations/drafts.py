"""The draft sink of the turn in progress: where its streamed previews go.

A front end that can show a reply growing (Telegram's `sendMessageDraft` in private chats, the
terminal's one line) opens `streaming(sink)` around a turn; the responder reads `current_sink()`
and hands every draft (the best hypothesis so far, cleaned like the reply, whole words only) to
it. A context variable rather than one more argument through every responder: a turn's task
carries it from the handler to the model engine, other turns' tasks never see it, and
responders that cannot stream simply never call it. A draft is a preview only: the reply is
still stored and sent as today (DESIGN.md invariant 12).

Before anything of the turn is written to the outbox, the conversation layer awaits
`end_drafts()`: the front end's `done` stops the drafts and waits for one still in flight. Any
replica may send the outbox row as soon as it is committed, so this is the one point where a
draft can still be kept from reaching the chat after the reply.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator

from bot.engine.protocol import DraftSink

DraftsDone = Callable[[], Awaitable[None]]

_Turn = tuple[DraftSink, DraftsDone | None]

_turn: contextvars.ContextVar[_Turn | None] = contextvars.ContextVar("draft_sink", default=None)


def current_sink() -> DraftSink | None:
    """The sink of the turn running in this task, if its front end streams."""
    turn = _turn.get()
    return turn[0] if turn is not None else None


async def end_drafts() -> None:
    """No more drafts in this turn, and none in flight: its reply (or notice) is next."""
    turn = _turn.get()
    if turn is not None and turn[1] is not None:
        await turn[1]()


@contextlib.contextmanager
def streaming(sink: DraftSink | None, done: DraftsDone | None = None) -> Iterator[None]:
    """Send this task's drafts to `sink` for the duration of the block (None: no drafts);
    `end_drafts()` awaits `done` (drafts that travel, e.g. over HTTP, and can arrive late)."""
    token = _turn.set((sink, done) if sink is not None else None)
    try:
        yield
    finally:
        _turn.reset(token)
