"""The autopilot's rows: its policy on the experiment (`experiments.autopilot`) and its
decisions (`autopilot_decisions`). bot/service/autopilot.py owns the transactions; these
functions never commit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.models import AutopilotDecision, ExperimentRow, utcnow


@dataclass(frozen=True, slots=True)
class StoredDecision:
    """One row of `autopilot_decisions`."""

    id: int
    experiment: str
    based_on: int  # the experiment's version the check read
    variant: str
    control: str
    action: str  # "promote" or "rollback"
    reason: str
    figures: dict[str, Any]
    decided_by: str
    created_at: datetime


async def policy(db: AsyncSession, experiment: str) -> tuple[int, dict[str, Any] | None] | None:
    """The experiment's version and autopilot policy (None: off); None if not stored."""
    row = (
        await db.execute(
            select(ExperimentRow.version, ExperimentRow.autopilot).where(
                ExperimentRow.name == experiment
            )
        )
    ).one_or_none()
    if row is None:
        return None
    version, stored = row
    return int(version), (None if stored is None else dict(json.loads(stored)))


async def set_policy(db: AsyncSession, experiment: str, value: dict[str, Any] | None) -> None:
    """Store the policy (None: off); the caller bumps the version."""
    await db.execute(
        update(ExperimentRow)
        .where(ExperimentRow.name == experiment)
        .values(
            autopilot=None if value is None else json.dumps(value, sort_keys=True),
            updated_at=utcnow(),
        )
    )


async def claim(db: AsyncSession, experiment: str, seen: int) -> bool:
    """Move the experiment's version on from `seen`, only if it is still `seen`; True if so.

    The first statement of a decision's transaction: on PostgreSQL the row lock makes a second
    claimant wait and then find the version moved (0 rows); SQLite serialises writers. Either
    way one check decides, and any change made since the check read its figures (an admin
    command, another replica's decision, the autopilot turned off) voids the decision.
    """
    result = await db.execute(
        update(ExperimentRow)
        .where(ExperimentRow.name == experiment, ExperimentRow.version == seen)
        .values(version=ExperimentRow.version + 1, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0) == 1


async def record(
    db: AsyncSession,
    *,
    experiment: str,
    based_on: int,
    variant: str,
    control: str,
    action: str,
    reason: str,
    figures: dict[str, Any],
    decided_by: str,
) -> bool:
    """Store a decision unless one was stored for (experiment, based_on) already; True if
    stored now."""
    values = {
        "experiment": experiment,
        "based_on": based_on,
        "variant": variant,
        "control": control,
        "action": action,
        "reason": reason,
        "figures": json.dumps(figures, sort_keys=True, allow_nan=False),
        "decided_by": decided_by,
        "created_at": utcnow(),
    }
    return await insert_unless_present(db, AutopilotDecision, values, ["experiment", "based_on"])


async def decisions(db: AsyncSession, experiment: str, limit: int = 20) -> list[StoredDecision]:
    """The experiment's most recent decisions, newest first."""
    rows = await db.scalars(
        select(AutopilotDecision)
        .where(AutopilotDecision.experiment == experiment)
        .order_by(AutopilotDecision.id.desc())
        .limit(limit)
    )
    return [
        StoredDecision(
            r.id,
            r.experiment,
            r.based_on,
            r.variant,
            r.control,
            r.action,
            r.reason,
            dict(json.loads(r.figures)),
            r.decided_by,
            r.created_at,
        )
        for r in rows
    ]
