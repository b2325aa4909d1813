"""Replica heartbeat queries (the `replicas` table). Functions take an AsyncSession and never
commit; bot/service/heartbeat.py decides when to call them.

Heartbeats are written with the database's clock and judged against it, in the same query:
replicas on machines whose clocks disagree still agree on who is alive."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import db_now, insert_unless_present
from bot.db.models import Replica


async def register(db: AsyncSession, owner: str, host: str, pid: int, info: str) -> None:
    """Write this replica's row (again, if a peer pruned it while we were unreachable)."""
    now = db_now(db)
    values = {
        "owner": owner,
        "host": host,
        "pid": pid,
        "started_at": now,
        "heartbeat_at": now,
        "info": info,
    }
    if not await insert_unless_present(db, Replica, values, ["owner"]):
        await beat(db, owner, info)


async def beat(db: AsyncSession, owner: str, info: str | None = None) -> bool:
    """Push this replica's heartbeat to the database's now; False if its row is gone."""
    values: dict[str, object] = {"heartbeat_at": db_now(db)}
    if info is not None:
        values["info"] = info
    result = await db.execute(update(Replica).where(Replica.owner == owner).values(**values))
    return bool(getattr(result, "rowcount", 0))


async def remove(db: AsyncSession, owner: str) -> None:
    """A clean stop: the replica's row goes (its leases were given back before)."""
    await db.execute(delete(Replica).where(Replica.owner == owner))


def stale(db: AsyncSession, after_s: float) -> ColumnElement[bool]:
    """Replicas silent for over `after_s` by the database's clock: dead, or cut off and
    fenced."""
    return Replica.heartbeat_at < db_now(db, -after_s)


async def is_dead(db: AsyncSession, owner: str, after_s: float) -> bool:
    """Whether `owner` has a replica row whose heartbeat is over `after_s` old.

    An owner without a row (a process of an older version, or a test's bare Leases) is judged
    by its lease's expiry alone: every replica writes its row before it takes any lease.
    """
    found = await db.scalar(select(Replica.owner).where(Replica.owner == owner, stale(db, after_s)))
    return found is not None


async def alive(db: AsyncSession, after_s: float) -> int:
    """How many replicas beat within the last `after_s` seconds."""
    count = await db.scalar(select(func.count()).select_from(Replica).where(~stale(db, after_s)))
    return int(count or 0)


async def prune(db: AsyncSession, after_s: float) -> int:
    """Forget replicas silent for over `after_s` (long dead); returns how many."""
    result = await db.execute(delete(Replica).where(stale(db, after_s)))
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True)
class ReplicaRow:
    """A replica as its heartbeat row says."""

    owner: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    info: dict[str, Any]


def _info(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def live_replicas(db: AsyncSession, after_s: float) -> list[ReplicaRow]:
    """The replicas that beat within the last `after_s` seconds (by the database's clock)."""
    return [_row(r) for r in await db.scalars(select(Replica).where(~stale(db, after_s)))]


async def all_replicas(db: AsyncSession) -> list[ReplicaRow]:
    """Every known replica, the most recent heartbeat first (for operators)."""
    rows = await db.scalars(select(Replica).order_by(Replica.heartbeat_at.desc()))
    return [_row(r) for r in rows]


def _row(r: Replica) -> ReplicaRow:
    return ReplicaRow(r.owner, r.host, r.pid, r.started_at, r.heartbeat_at, _info(r.info))
