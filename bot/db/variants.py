"""The experiments and their variants as the database keeps them (bot.engine.live owns the
transactions and the validation; these functions never commit)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import ExperimentRow, VariantRow, Vote, utcnow


@dataclass(frozen=True, slots=True)
class StoredVariant:
    """One row of `variants`."""

    name: str
    model: str | None  # None: each replica's BOT_MODEL
    weight: float
    control: bool
    options: dict[str, Any] = field(default_factory=dict)  # the other keys of the file's table
    position: int = 0


@dataclass(frozen=True, slots=True)
class StoredExperiment:
    """One row of `experiments` with its variants in hash order."""

    name: str
    allocation: str
    version: int
    variants: tuple[StoredVariant, ...]


async def version(db: AsyncSession, experiment: str) -> int | None:
    """The experiment's version (None: not in the database yet); one primary-key read."""
    return await db.scalar(select(ExperimentRow.version).where(ExperimentRow.name == experiment))


async def load(db: AsyncSession, experiment: str) -> StoredExperiment | None:
    """The experiment and its variants, or None if it is not stored."""
    row = await db.get(ExperimentRow, experiment, populate_existing=True)
    if row is None:
        return None
    variants = await db.scalars(
        select(VariantRow)
        .where(VariantRow.experiment == experiment)
        .order_by(VariantRow.position, VariantRow.name)
    )
    return StoredExperiment(
        row.name,
        row.allocation,
        row.version,
        tuple(
            StoredVariant(
                v.name,
                v.model,
                float(v.weight),
                bool(v.is_control),
                json.loads(v.options),
                v.position,
            )
            for v in variants
        ),
    )


async def seed(
    db: AsyncSession, experiment: str, allocation: str, variants: Sequence[StoredVariant]
) -> bool:
    """Store the experiment with `variants` unless it is stored already; True if stored now.

    Replicas starting together race here: the primary key lets one of them in.
    """
    now = utcnow()
    values = {
        "name": experiment,
        "allocation": allocation,
        "version": 1,
        "created_at": now,
        "updated_at": now,
    }
    if not await insert_unless_present(db, ExperimentRow, values, ["name"]):
        return False
    for position, variant in enumerate(variants, start=1):
        await add(db, experiment, variant, position=position)
    return True


async def bump(db: AsyncSession, experiment: str) -> int | None:
    """Count a change of the experiment (every replica polls the version); on PostgreSQL the
    row stays locked until commit, so two admins' changes happen one after the other.
    Returns the new version (None: not stored)."""
    await db.execute(
        update(ExperimentRow)
        .where(ExperimentRow.name == experiment)
        .values(version=ExperimentRow.version + 1, updated_at=utcnow())
    )
    return await version(db, experiment)


async def add(
    db: AsyncSession, experiment: str, variant: StoredVariant, *, position: int | None = None
) -> None:
    """Insert a variant, after the others unless `position` is given."""
    if position is None:
        last = await db.scalar(
            select(func.max(VariantRow.position)).where(VariantRow.experiment == experiment)
        )
        position = int(last or 0) + 1
    now = utcnow()
    db.add(
        VariantRow(
            experiment=experiment,
            name=variant.name,
            position=position,
            model=variant.model,
            weight=variant.weight,
            is_control=variant.control,
            options=json.dumps(variant.options, sort_keys=True),
            created_at=now,
            updated_at=now,
        )
    )
    await db.flush()


async def replace(db: AsyncSession, experiment: str, variant: StoredVariant) -> None:
    """Update a variant's model, weight, options and position (not the control flag)."""
    await db.execute(
        update(VariantRow)
        .where(VariantRow.experiment == experiment, VariantRow.name == variant.name)
        .values(
            model=variant.model,
            weight=variant.weight,
            options=json.dumps(variant.options, sort_keys=True),
            position=variant.position,
            updated_at=utcnow(),
        )
    )


async def set_weight(db: AsyncSession, experiment: str, name: str, weight: float) -> None:
    """A variant's new weight."""
    await db.execute(
        update(VariantRow)
        .where(VariantRow.experiment == experiment, VariantRow.name == name)
        .values(weight=weight, updated_at=utcnow())
    )


async def set_control(db: AsyncSession, experiment: str, name: str) -> None:
    """Make `name` the experiment's only control."""
    now = utcnow()
    # First clear, then set: the unique index on the control allows one at every moment.
    await db.execute(
        update(VariantRow)
        .where(VariantRow.experiment == experiment, VariantRow.is_control.is_(True))
        .values(is_control=False, updated_at=now)
    )
    await db.execute(
        update(VariantRow)
        .where(VariantRow.experiment == experiment, VariantRow.name == name)
        .values(is_control=True, updated_at=now)
    )


async def remove(db: AsyncSession, experiment: str, name: str) -> None:
    """Delete a variant (its chats' assignments, replies and votes stay)."""
    await db.execute(
        delete(VariantRow).where(VariantRow.experiment == experiment, VariantRow.name == name)
    )


async def set_allocation(db: AsyncSession, experiment: str, allocation: str) -> None:
    """How the experiment splits new chats."""
    await db.execute(
        update(ExperimentRow)
        .where(ExperimentRow.name == experiment)
        .values(allocation=allocation, updated_at=utcnow())
    )


async def vote_counts(db: AsyncSession, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """👍 and 👎 per variant (of the replies it produced), for the bandit."""
    up = func.sum(case((Vote.value == 1, 1), else_=0))
    down = func.sum(case((Vote.value == -1, 1), else_=0))
    rows = await db.execute(
        select(Vote.variant, up, down).where(Vote.variant.in_(list(names))).group_by(Vote.variant)
    )
    counts = {name: (0, 0) for name in names}
    for name, n_up, n_down in rows:
        counts[str(name)] = (int(n_up or 0), int(n_down or 0))
    return counts
