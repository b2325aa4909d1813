"""The state enums and the tables' CHECK constraints name the same values."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest
from sqlalchemy import CheckConstraint

from bot.db.models import (
    Inbox,
    InboxStatus,
    Message,
    Outbox,
    OutboxKind,
    Role,
    Session,
    SessionStatus,
)


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        (Session, "status", SessionStatus),
        (Message, "role", Role),
        (Outbox, "kind", OutboxKind),
        (Inbox, "status", InboxStatus),
    ],
)
def test_enum_matches_check_constraint(table: type, column: str, enum: type[StrEnum]) -> None:
    checks = [
        str(c.sqltext)
        for c in table.__table__.constraints  # type: ignore[attr-defined]
        if isinstance(c, CheckConstraint) and str(c.sqltext).startswith(f"{column} IN")
    ]
    assert len(checks) == 1
    assert set(re.findall(r"'(\w+)'", checks[0])) == {e.value for e in enum}
