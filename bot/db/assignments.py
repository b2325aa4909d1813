"""Variant assignments: which model variant answers a chat (bot.engine.assign)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import Assignment, AssignmentSource, utcnow


async def variant_of(db: AsyncSession, chat_id: int) -> str | None:
    """The chat's stored variant, if it has one."""
    return await db.scalar(select(Assignment.variant).where(Assignment.chat_id == chat_id))


async def assign_unless_present(
    db: AsyncSession,
    chat_id: int,
    experiment: str,
    variant: str,
    *,
    split: Mapping[str, float] | None = None,
    by: str = "weights",
) -> str:
    """Store `variant` for a chat that has none (its first turn); returns the chat's variant,
    which is the stored one if another process assigned it first. `split`: the allocation it
    was drawn from (variant -> probability) and how it was made (`by`: weights or thompson),
    recorded with it."""
    await insert_unless_present(
        db,
        Assignment,
        _row(chat_id, experiment, variant, AssignmentSource.HASH, split, by),
        ["chat_id"],
    )
    stored = await variant_of(db, chat_id)
    assert stored is not None
    return stored


async def set_variant(
    db: AsyncSession,
    chat_id: int,
    experiment: str,
    variant: str,
    source: AssignmentSource,
    *,
    split: Mapping[str, float] | None = None,
    by: str = "weights",
) -> None:
    """Assign (or move) a chat to `variant`; `split` as for assign_unless_present (a move by
    an admin or the user has none: it was nobody's draw)."""
    row = _row(chat_id, experiment, variant, source, split, by)
    values = {k: v for k, v in row.items() if k != "chat_id"}
    moved = await db.execute(update(Assignment).where(Assignment.chat_id == chat_id).values(values))
    if not getattr(moved, "rowcount", 0):
        await insert_unless_present(db, Assignment, row, ["chat_id"])


def _row(
    chat_id: int,
    experiment: str,
    variant: str,
    source: str,
    split: Mapping[str, float] | None = None,
    by: str = "weights",
) -> dict[str, object]:
    return {
        "chat_id": chat_id,
        "experiment": experiment,
        "variant": variant,
        "source": source,
        "assigned_at": utcnow(),
        "probability": split.get(variant) if split else None,
        "allocation": json.dumps({"by": by, "split": dict(split)}, sort_keys=True)
        if split
        else None,
    }


async def counts(db: AsyncSession) -> dict[str, int]:
    """Assigned chats per variant."""
    rows = await db.execute(select(Assignment.variant, func.count()).group_by(Assignment.variant))
    return {str(name): int(n) for name, n in rows}
