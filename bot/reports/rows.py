"""The row types the reports share (the admin reports, exports and the dashboard's pages), and
the columns they are read from, so that one message reads the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, func, select

from bot.db.models import Message, Role, Session


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    """One utterance as an admin reads it."""

    id: int
    role: str
    text: str
    created_at: datetime
    delivered_at: datetime | None
    latency_ms: float | None
    # Bot replies: the persona the model read for it ('' = none); None for user messages.
    reply_persona: str | None


# The persona the model read for a bot reply (NULL for user messages). A reply's own NULL (one
# stored by a release before migration 0010, after it ran) reads as its session's persona, as
# the migration read the replies before it.
REPLY_PERSONA = case(
    (
        Message.role == Role.BOT,
        func.coalesce(
            Message.persona,
            select(Session.persona)
            .where(Session.id == Message.session_id)
            .correlate(Message)
            .scalar_subquery(),
        ),
    )
).label("reply_persona")

# A message's columns as the reports read it: TranscriptMessage's fields, in order (the
# dashboard's TranscriptLine starts with them), and the message half of an ExportRow.
MESSAGE_COLUMNS = (
    Message.id,
    Message.role,
    Message.text,
    Message.created_at,
    Message.delivered_at,
    Message.latency_ms,
    REPLY_PERSONA,
)
