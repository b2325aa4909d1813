"""The audit log of `admin`: every subcommand that changes data is recorded (bot/db/audit.py),
`pending` before it runs and its result after, so that no change is made unless its row is
written; `admin restore` is recorded after it ran, in the database it restored.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.admin import access as admin_access
from bot.admin import sql as admin_sql
from bot.admin.common import hint
from bot.db import audit
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import AuditSource
from bot.engine.variants import Experiment
from bot.reports.admin import AdminError

# Changes that are not: `variants list` and `variants autopilot check` only read.
_READ_ONLY_VARIANTS = ("list", "")
# Arguments the audit row leaves out, and masks in its result ("chat N": the way every message
# of `forget` names it): `forget` deletes every row that mentions the chat
# (docs/administration.md), and its audit row must not be one.
_UNRECORDED = {"forget": ("chat_id",)}
# Namespace entries that are not the operator's arguments.
_NOT_ARGUMENTS = (
    "command",
    "admin_command",
    "variants_command",
    "access_command",
    "json",
    "retention_days",
    "settings",
)


def audited(
    args: argparse.Namespace, experiment: Experiment | None
) -> tuple[str, str | None] | None:
    """(action, target) of a subcommand that changes data; None for one that only reads.

    A new subcommand that writes names itself here (and so is recorded by `admin`).
    """
    command = args.admin_command
    if command == "forget":
        return command, None  # no row may mention a forgotten chat: not even this one
    if command == "assign":
        return command, str(args.chat_id)
    if command == "access":
        return admin_access.audited(args)
    if command == "variants":
        change = getattr(args, "variants_command", None) or ""
        if change in _READ_ONLY_VARIANTS or (change == "autopilot" and args.state == "check"):
            return None
        name = getattr(args, "name", None)
        return f"variants {change}", name or (experiment.name if experiment else "")
    return None


async def recorded(
    engine: AsyncEngine,
    args: argparse.Namespace,
    experiment: Experiment | None,
    run: Callable[[], Awaitable[int]],
) -> int:
    """Run a subcommand; one that changes data is recorded before and after (bot/db/audit.py):
    pending, then ok / exit N / the error. No change is made unless its row is written."""
    what = audited(args, experiment)
    if what is None:
        return await run()
    sessionmaker = make_sessionmaker(engine)
    unrecorded = _UNRECORDED.get(args.admin_command, ())
    pending = await audit.begin(
        sessionmaker,
        actor=audit.os_actor(),
        source=AuditSource.CLI,
        action=what[0],
        target=what[1],
        details=audit.arguments(vars(args), leave_out=_NOT_ARGUMENTS + unrecorded),
    )
    try:
        status = await run()
    except BaseException as err:
        shown = hint(err) if isinstance(err, DBAPIError) else str(err) or type(err).__name__
        for name in unrecorded:  # the messages say "chat N"; a count that equals N stays
            value = re.escape(str(getattr(args, name)))
            shown = re.sub(rf"\bchat {value}(?!\d)", f"chat <{name}>", shown)
        await _finish(sessionmaker, pending, audit.outcome(error=shown))
        raise
    await _finish(sessionmaker, pending, audit.outcome(status))
    return status


async def recorded_after(
    url: str, action: str, target: str | None, run: Callable[[], Awaitable[int]]
) -> int:
    """`admin restore`, recorded after it ran: the database it replaces may have no audit
    table yet (an empty one), and what it had is gone once restored, so the row goes into the
    restored database (at this release's revision by then). A refused restore changed
    nothing and is recorded in the database as it was, when it has the table."""
    status: int | None = None
    error: str | None = None
    try:
        status = await run()
        return status
    except BaseException as err:
        error = str(err) or type(err).__name__
        raise
    finally:
        if status is not None or error is not None:
            await _record_once(url, action, target, audit.outcome(status, error))


async def _record_once(url: str, action: str, target: str | None, result: str) -> None:
    """One finished audit row, best effort: a database without the table (or none at all)
    gets a warning on stderr instead."""
    if make_url(url).get_backend_name() == "sqlite":
        try:
            admin_sql.sqlite_path(url)
        except AdminError:
            return  # no database file: nothing was changed, and nowhere to record it
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine).begin() as db:
            await audit.record(
                db,
                actor=audit.os_actor(),
                source=AuditSource.CLI,
                action=action,
                target=target,
                details={},
                result=result,
            )
    except (DBAPIError, OSError) as err:
        print(f"warning: the audit log could not record this {action}: {err}", file=sys.stderr)
    finally:
        await engine.dispose()


async def _finish(sessionmaker: Any, pending: audit.Pending, result: str) -> None:
    try:
        await audit.finish(sessionmaker, pending, result)
    except (DBAPIError, OSError) as err:  # the change's own outcome stands; say what is missing
        print(
            f"warning: audit row {pending.id} stays 'pending' (its result {result!r} could not "
            f"be written: {err}); `python -m bot admin audit` shows it",
            file=sys.stderr,
        )


Handler = Callable[[AsyncEngine, argparse.Namespace, TextIO], Awaitable[int]]
