"""The draft sink of the turn in progress: where its streamed previews go.

A front end that can show a reply growing (Telegram's `sendMessageDraft` in private chats, the
terminal's one line) opens `streaming(sink)` around a turn; the responder reads `current_sink()`
and hands every draft (the best hypothesis so far, cleaned like the reply, whole words only) to
it. A context variable rather than one more argument through every responder: a turn's task
carries it from the handler to the model engine, other turns' tasks never see it, and
responders that cannot stream simply never call it. A draft is a preview only: the reply is
still stored and sent as today (DESIGN.md invariant 12).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

DraftSink = Callable[[str], None]

_sink: contextvars.ContextVar[DraftSink | None] = contextvars.ContextVar("draft_sink", default=None)


def current_sink() -> DraftSink | None:
    """The sink of the turn running in this task, if its front end streams."""
    return _sink.get()


@contextlib.contextmanager
def streaming(sink: DraftSink | None) -> Iterator[None]:
    """Send this task's drafts to `sink` for the duration of the block (None: no drafts)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
