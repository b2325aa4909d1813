"""Variant assignments: which model variant answers a chat (bot.engine.assign)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import Assignment, AssignmentSource, utcnow


@dataclass(frozen=True, slots=True)
class Choice:
    """A chat's variant in an experiment, and the draw it came from: the allocation `split`
    (variant -> probability) made `by` weights or thompson; no split: nobody's draw (a move by
    an admin or by the user)."""

    experiment: str
    variant: str
    split: Mapping[str, float] | None = None
    by: str = "weights"


async def variant_of(db: AsyncSession, chat_id: int) -> str | None:
    """The chat's stored variant, if it has one."""
    return await db.scalar(select(Assignment.variant).where(Assignment.chat_id == chat_id))


async def assign_unless_present(db: AsyncSession, chat_id: int, choice: Choice) -> str:
    """Store `choice` for a chat that has none (its first turn); returns the chat's variant,
    which is the stored one if another process assigned it first."""
    await insert_unless_present(
        db, Assignment, _row(chat_id, choice, AssignmentSource.HASH), ["chat_id"]
    )
    stored = await variant_of(db, chat_id)
    assert stored is not None
    return stored


async def set_variant(
    db: AsyncSession, chat_id: int, choice: Choice, source: AssignmentSource
) -> None:
    """Assign (or move) a chat to `choice`."""
    row = _row(chat_id, choice, source)
    values = {k: v for k, v in row.items() if k != "chat_id"}
    moved = await db.execute(update(Assignment).where(Assignment.chat_id == chat_id).values(values))
    if not getattr(moved, "rowcount", 0):
        await insert_unless_present(db, Assignment, row, ["chat_id"])


def _row(chat_id: int, choice: Choice, source: str) -> dict[str, object]:
    split = choice.split
    return {
        "chat_id": chat_id,
        "experiment": choice.experiment,
        "variant": choice.variant,
        "source": source,
        "assigned_at": utcnow(),
        "probability": split.get(choice.variant) if split else None,
        "allocation": json.dumps({"by": choice.by, "split": dict(split)}, sort_keys=True)
        if split
        else None,
    }


async def counts(db: AsyncSession) -> dict[str, int]:
    """Assigned chats per variant."""
    rows = await db.execute(select(Assignment.variant, func.count()).group_by(Assignment.variant))
    return {str(name): int(n) for name, n in rows}
