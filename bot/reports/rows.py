"""The row types the reports share (the admin reports, exports and the dashboard's pages), and
the columns they are read from, so that one message reads the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bot.db.models import Message


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    """One utterance as an admin reads it."""

    id: int
    role: str
    text: str
    created_at: datetime
    delivered_at: datetime | None
    latency_ms: float | None


# A message's columns as the reports read it: TranscriptMessage's fields, in order (the
# dashboard's TranscriptLine starts with them), and the message half of an ExportRow.
MESSAGE_COLUMNS = (
    Message.id,
    Message.role,
    Message.text,
    Message.created_at,
    Message.delivered_at,
    Message.latency_ms,
)
