"""The audit log (`audit_log`): who changed what, when, and how it ended.

How a change is recorded (bot/admin/cli.py, `admin`): the row is written "pending" in its own
transaction *before* the change is made, and its result is written over it afterwards ("ok",
"exit N", or "error: ..."). So no change is made that the log does not hold (if the pending row
cannot be written, the command stops before changing anything), and a failed change is
recorded as failed even though its own transaction rolled back. The cost is two small
transactions per change; a row left "pending" says the command died (or lost the database)
between the change and its result. The change itself is not in the audit row's transaction:
the change functions (bot/engine/live.py, bot/conversations/store.py) own theirs, and the
pending row is what makes it safe.

The autopilot's decisions are written in the decision's own transaction (`record` with
`db`), so a decision and its audit row commit together or not at all.

`details` holds the command's arguments; `arguments` keeps only plain values (strings,
numbers, booleans, lists of them), so a Settings object (with the bot's token) never gets in.
"""

from __future__ import annotations

import getpass
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.models import AuditEntry, AuditSource, utcnow

PENDING = "pending"
OK = "ok"
MAX_RESULT = 2000  # characters of an error message kept


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One row of `audit_log`."""

    id: int
    at: datetime
    actor: str
    source: str
    action: str
    target: str | None
    details: dict[str, Any]
    result: str


def os_actor() -> str:
    """Who runs this command: the OS user (getpass.getuser()); under sudo, the user who ran
    sudo is named too, so that "root" does not hide them."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry (a bare container)
        user = f"uid {os.getuid()}"
    sudo = os.environ.get("SUDO_USER", "").strip()
    return f"{sudo} (sudo as {user})" if sudo and sudo != user else user


def telegram_actor(user_id: int) -> str:
    """The actor of a change an admin (ADMIN_USER_IDS) makes from Telegram."""
    return f"telegram:{user_id}"


def autopilot_actor(replica: str) -> str:
    """The actor of the autopilot's decisions on a replica (replicas.owner)."""
    return f"autopilot@{replica}"


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | bool):
        return True
    return isinstance(value, list | tuple) and all(_plain(v) for v in value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # `weight nan` is refused, and recorded as typed: "nan"
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def arguments(values: dict[str, Any], leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The plain, set values of a command's arguments (an argparse Namespace's vars): None
    and anything that is not a string, number, boolean or list of them is left out; a float
    that JSON cannot hold (nan, inf) becomes its text."""
    return {
        k: _json_safe(v)
        for k, v in sorted(values.items())
        if k not in leave_out and v is not None and _plain(v)
    }


def outcome(status: int | None = None, error: BaseException | str | None = None) -> str:
    """The result column for an exit status, or an exception (or the message shown for it)."""
    if error is not None:
        text = error if isinstance(error, str) else str(error) or type(error).__name__
        return ("error: " + text)[:MAX_RESULT]
    return OK if status == 0 else f"exit {status}"


def _values(
    *, actor: str, source: AuditSource, action: str, target: str | None, details: dict[str, Any]
) -> dict[str, Any]:
    return {
        "at": utcnow(),
        "actor": actor[:128],
        "source": str(source),
        "action": action[:64],
        "target": None if target is None else target[:128],
        "details": json.dumps(details, sort_keys=True, ensure_ascii=False, allow_nan=False),
    }


async def record(
    db: AsyncSession,
    *,
    actor: str,
    source: AuditSource,
    action: str,
    target: str | None,
    details: dict[str, Any],
    result: str,
) -> int:
    """Add a row in the caller's transaction (never commits); its id."""
    entry = AuditEntry(
        **_values(actor=actor, source=source, action=action, target=target, details=details),
        result=result,
    )
    db.add(entry)
    await db.flush()
    return int(entry.id)


@dataclass(slots=True)
class Pending:
    """A change about to be made: its row, written "pending" (see the module's docstring)."""

    id: int
    values: dict[str, Any]


async def begin(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    actor: str,
    source: AuditSource,
    action: str,
    target: str | None,
    details: dict[str, Any],
) -> Pending:
    """Write the row "pending", committed, before the change is made."""
    values = _values(actor=actor, source=source, action=action, target=target, details=details)
    async with sessionmaker.begin() as db:
        entry = AuditEntry(**values, result=PENDING)
        db.add(entry)
        await db.flush()
        return Pending(int(entry.id), values)


async def finish(
    sessionmaker: async_sessionmaker[AsyncSession], pending: Pending, result: str
) -> None:
    """Write the result over the pending row. If the row is gone (the change replaced the
    database, as a restore does), the whole row is written again with its result."""
    async with sessionmaker.begin() as db:
        done = await db.execute(
            update(AuditEntry)
            .where(
                AuditEntry.id == pending.id,
                AuditEntry.at == pending.values["at"],
                AuditEntry.action == pending.values["action"],
                AuditEntry.result == PENDING,
            )
            .values(result=result)
            .execution_options(synchronize_session=False)
        )
        if int(getattr(done, "rowcount", 0) or 0) == 0:
            db.add(AuditEntry(**pending.values, result=result))


async def recent(db: AsyncSession, limit: int = 50) -> list[AuditRow]:
    """The newest `limit` rows, newest first."""
    rows = await db.scalars(
        select(AuditEntry).order_by(AuditEntry.at.desc(), AuditEntry.id.desc()).limit(limit)
    )
    return [
        AuditRow(
            r.id,
            r.at,
            r.actor,
            r.source,
            r.action,
            r.target,
            dict(json.loads(r.details)),
            r.result,
        )
        for r in rows
    ]
