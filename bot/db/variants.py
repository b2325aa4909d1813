"""The experiments and their variants as the database keeps them (bot.engine.live owns the
transactions and the validation; these functions never commit)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, case, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import ExperimentRow, Message, Role, VariantRow, VariantVersion, Vote, utcnow

# Options that change where and how fast a variant runs, not what it replies: changing them
# keeps the variant's identity (its votes and ratings). Any other option, or the model, starts
# a new one.
SAME_REPLIES = frozenset({"threads", "replicas", "num_cpus", "num_gpus"})


@dataclass(frozen=True, slots=True)
class StoredVariant:
    """One row of `variants`."""

    name: str
    model: str | None  # None: each replica's BOT_MODEL
    weight: float
    control: bool
    options: dict[str, Any] = field(default_factory=dict)  # the other keys of the file's table
    position: int = 0
    # Its current identity (variant_versions.id; 0: not stored). Not part of equality: the
    # file's variant and the stored one are the same definition.
    version: int = field(default=0, compare=False)


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
                int(v.version_id or 0),
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
            version_id=await _new_identity(db, experiment, variant),
        )
    )
    await db.flush()


async def _new_identity(db: AsyncSession, experiment: str, variant: StoredVariant) -> int:
    """A new identity for `variant` (a name added, again, or given another model or reply
    options); the name's earlier ones are retired. Returns its id."""
    now = utcnow()
    await _retire(db, experiment, variant.name)
    identity = VariantVersion(
        experiment=experiment,
        name=variant.name,
        model=variant.model,
        options=json.dumps(variant.options, sort_keys=True),
        created_at=now,
    )
    db.add(identity)
    await db.flush()
    return int(identity.id)


async def _retire(db: AsyncSession, experiment: str, name: str) -> None:
    await db.execute(
        update(VariantVersion)
        .where(
            VariantVersion.experiment == experiment,
            VariantVersion.name == name,
            VariantVersion.retired_at.is_(None),
        )
        .values(retired_at=utcnow())
    )


def same_identity(a: StoredVariant, b: StoredVariant) -> bool:
    """Whether both give the same replies: the same model and the same options, apart from
    those that only say where and how fast it runs (SAME_REPLIES)."""

    def replies(options: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in options.items() if k not in SAME_REPLIES}

    return a.model == b.model and replies(a.options) == replies(b.options)


async def replace(
    db: AsyncSession, experiment: str, variant: StoredVariant, before: StoredVariant
) -> None:
    """Update a variant's model, weight, options and position (not the control flag); a new
    model or new reply options (`before`: the stored definition) start a new identity."""
    values: dict[str, Any] = {
        "model": variant.model,
        "weight": variant.weight,
        "options": json.dumps(variant.options, sort_keys=True),
        "position": variant.position,
        "updated_at": utcnow(),
    }
    if not same_identity(variant, before):
        values["version_id"] = await _new_identity(db, experiment, variant)
    else:
        await db.execute(
            update(VariantVersion)
            .where(VariantVersion.id == before.version)
            .values(options=values["options"])
        )
    await db.execute(
        update(VariantRow)
        .where(VariantRow.experiment == experiment, VariantRow.name == variant.name)
        .values(values)
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
    """Delete a variant (its chats' assignments, replies and votes stay, with its identity,
    retired now: a name added again starts a new one)."""
    await _retire(db, experiment, name)
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


def current_identity(column: Any, experiment: str | None = None) -> ColumnElement[bool]:
    """A filter on a `variant_version` column (messages, votes, ratings): the rows of the
    newest identity of their variant's name in `experiment` (None: in any experiment), which
    for a variant in the experiment is its current one. A row without an identity (stored by a
    release older than migration 0012 while it ran) counts as its name's current identity.

    The reports, /stats and the bandit count these rows only, so a name removed and added
    again, or given another model, starts from nothing; the history stays in the tables."""
    newest = select(func.max(VariantVersion.id)).group_by(
        VariantVersion.experiment, VariantVersion.name
    )
    if experiment is not None:
        newest = newest.where(VariantVersion.experiment == experiment)
    return or_(column.is_(None), column.in_(newest))


def identity_of(name: str | BindParameter[str]) -> Any:
    """The current identity of the variant called `name` (a scalar subquery; NULL if no
    experiment has it), for rows stored by a caller that does not know it (`name` may be a
    bound parameter, in a statement built once)."""
    return select(func.max(VariantRow.version_id)).where(VariantRow.name == name).scalar_subquery()


async def vote_counts(
    db: AsyncSession, names: Sequence[str], experiment: str | None = None
) -> dict[str, tuple[int, int]]:
    """👍 and 👎 per variant (of the replies its current identity produced), for the bandit."""
    up = func.sum(case((Vote.value == 1, 1), else_=0))
    down = func.sum(case((Vote.value == -1, 1), else_=0))
    rows = await db.execute(
        select(Vote.variant, up, down)
        .where(Vote.variant.in_(list(names)), current_identity(Vote.variant_version, experiment))
        .group_by(Vote.variant)
    )
    counts = {name: (0, 0) for name in names}
    for name, n_up, n_down in rows:
        counts[str(name)] = (int(n_up or 0), int(n_down or 0))
    return counts


@dataclass(frozen=True, slots=True)
class Identity:
    """One identity a variant has had (a `variant_versions` row) and what it gathered."""

    id: int
    name: str
    model: str | None
    options: dict[str, Any]
    created_at: datetime
    retired_at: datetime | None  # None: the variant's current identity
    replies: int
    votes_up: int
    votes_down: int


async def history(db: AsyncSession, experiment: str) -> list[Identity]:
    """Every identity of the experiment's variants, by name then age, with its replies and
    votes (`admin variants list --all-versions`; the SQL is in docs/variants.md)."""
    replies = (
        select(Message.variant_version, func.count().label("n"))
        .where(Message.role == Role.BOT, Message.variant_version.is_not(None))
        .group_by(Message.variant_version)
        .subquery()
    )
    votes = (
        select(
            Vote.variant_version,
            func.sum(case((Vote.value == 1, 1), else_=0)).label("up"),
            func.sum(case((Vote.value == -1, 1), else_=0)).label("down"),
        )
        .where(Vote.variant_version.is_not(None))
        .group_by(Vote.variant_version)
        .subquery()
    )
    rows = await db.execute(
        select(VariantVersion, replies.c.n, votes.c.up, votes.c.down)
        .outerjoin(replies, replies.c.variant_version == VariantVersion.id)
        .outerjoin(votes, votes.c.variant_version == VariantVersion.id)
        .where(VariantVersion.experiment == experiment)
        .order_by(VariantVersion.name, VariantVersion.id)
    )
    return [
        Identity(
            int(v.id),
            v.name,
            v.model,
            json.loads(v.options),
            v.created_at,
            v.retired_at,
            int(n or 0),
            int(up or 0),
            int(down or 0),
        )
        for v, n, up, down in rows
    ]
