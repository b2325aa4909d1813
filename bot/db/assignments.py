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
    (variant -> probability) made `by` weights or thompson, or `by` FALLBACK (no weighted
    variant could serve: the control, with probability 1, and no draw at all); no split:
    nobody's draw (a move by an admin or by the user)."""

    experiment: str
    variant: str
    split: Mapping[str, float] | None = None
    by: str = "weights"


FALLBACK = "fallback"  # Choice.by of a chat sent to the fallback variant


async def variant_of(db: AsyncSession, chat_id: int) -> str | None:
    """The chat's stored variant, if it has one."""
    return await db.scalar(select(Assignment.variant).where(Assignment.chat_id == chat_id))


async def assign_unless_present(db: AsyncSession, chat_id: int, choice: Choice) -> str:
    """Store `choice` for a chat that has none (its first turn), as a hash draw (or a
    fallback); returns the chat's variant, which is the stored one if another process
    assigned it first."""
    source = AssignmentSource.FALLBACK if choice.by == FALLBACK else AssignmentSource.HASH
    await insert_unless_present(db, Assignment, _row(chat_id, choice, source), ["chat_id"])
    stored = await variant_of(db, chat_id)
    assert stored is not None
    return stored


async def set_variant(
    db: AsyncSession, chat_id: int, choice: Choice, source: AssignmentSource
) -> None:
    """Assign (or move) a chat to `choice`. MOVED (its variant was removed): the row keeps
    the draw the chat came from, with the variant it drew ("drawn"), which is what the
    sample-ratio check counts; it is no draw of its new variant (probability NULL)."""
    row = _row(chat_id, choice, source)
    if source == AssignmentSource.MOVED:
        row |= {"probability": None, "allocation": await _original_draw(db, chat_id)}
    values = {k: v for k, v in row.items() if k != "chat_id"}
    moved = await db.execute(update(Assignment).where(Assignment.chat_id == chat_id).values(values))
    if not getattr(moved, "rowcount", 0):
        await insert_unless_present(db, Assignment, row, ["chat_id"])


async def _original_draw(db: AsyncSession, chat_id: int) -> str | None:
    """The allocation a moved chat keeps: its hash draw's, with the variant drawn (a chat moved
    again keeps the first one's); None when it came from no draw (admin, user, fallback, or a
    row older than migration 0008)."""
    found = (
        await db.execute(
            select(Assignment.variant, Assignment.source, Assignment.allocation).where(
                Assignment.chat_id == chat_id
            )
        )
    ).first()
    if found is None or found.allocation is None:
        return None
    if found.source == AssignmentSource.MOVED:
        return str(found.allocation)
    if found.source != AssignmentSource.HASH:
        return None
    draw = json.loads(found.allocation)
    return json.dumps({**draw, "drawn": found.variant}, sort_keys=True)


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
