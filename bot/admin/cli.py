"""`python -m bot admin ...`: run a parsed subcommand (parsed by bot/admin/parsers.py) and turn
its errors into one line on stderr and an exit status.

The subcommands that only read live in bot/admin/read.py, the ones that change data in
bot/admin/changes.py (recorded in the audit log, bot/admin/recording.py), `admin access` in
bot/admin/access.py; `admin backup` and `admin restore` print here what bot/admin/backup.py did.
Every subcommand prints a readable table by default and JSON with `--json`, and reads the
database named by the settings (DATABASE_URL, or the SQLite file under DATA_DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.admin import access as admin_access
from bot.admin import backup as admin_backup
from bot.admin import changes, read
from bot.admin import sql as admin_sql
from bot.admin.common import UsageError, hint
from bot.admin.recording import recorded, recorded_after
from bot.config import Settings
from bot.db.engine import make_engine, safe_url
from bot.engine.live import VariantChangeError
from bot.engine.variants import Experiment, load_experiment
from bot.reports.admin import AdminError


async def _variants(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    """`admin variants`: the report, or the CHANGE given."""
    change = changes.VARIANT_CHANGES.get(getattr(args, "variants_command", None) or "")
    if change is not None:
        return await change(engine, args, out, experiment)
    return await read.run_variants_report(engine, args, out, experiment)


Handler = Callable[[AsyncEngine, argparse.Namespace, TextIO], Awaitable[int]]
ExperimentHandler = Callable[[AsyncEngine, argparse.Namespace, TextIO, Experiment], Awaitable[int]]

_HANDLERS: dict[str, Handler] = {
    "stats": read.run_stats,
    "sessions": read.run_sessions,
    "show": read.run_show,
    "export": read.run_export,
    "forget": changes.run_forget,
    "audit": read.run_audit,
    "access": admin_access.run,
}

# Subcommands that need the experiment (VARIANTS_FILE).
_EXPERIMENT_HANDLERS: dict[str, ExperimentHandler] = {
    "variants": _variants,
    "assign": changes.run_assign,
}


async def _backup_or_restore(url: str, args: argparse.Namespace, out: TextIO) -> int:
    """`admin backup` / `admin restore`, parsed; returns the exit status."""
    settings = getattr(args, "settings", None)
    alive_after_s = float(getattr(settings, "takeover_after_s", 5.0))
    path = Path(args.path)
    try:
        if args.admin_command == "backup":
            written = await admin_backup.backup(url, path, keep=args.keep)
            manifest = written.manifest
            if args.json:
                payload = {
                    "path": str(written.path),
                    **manifest.__dict__,
                    "pruned": [str(p) for p in written.pruned],
                }
                print(json.dumps(payload, indent=2), file=out)
            else:
                print(
                    f"backed up {manifest.database} (schema revision {manifest.revision}) to "
                    f"{written.path}: {manifest.bytes:,} bytes, manifest "
                    f"{admin_backup.manifest_path(written.path)}",
                    file=out,
                )
                for old in written.pruned:
                    print(f"deleted the older backup {old}", file=out)
            return 0
        done = await admin_backup.restore(url, path, force=args.force, alive_after_s=alive_after_s)
    except DBAPIError as err:
        reason = err.orig if err.orig is not None else err
        raise AdminError(f"database {safe_url(url)}: {reason}") from err
    except OSError as err:
        raise AdminError(f"{args.admin_command} {path}: {err}") from err
    except sqlite3.Error as err:
        raise AdminError(f"{args.admin_command} {path}: SQLite: {err}") from err
    if args.json:
        payload = {
            "restored": str(path),
            "database": safe_url(url),
            "revision": done.revision,
            "head": done.head,
            "migrated": done.migrated,
            "forced": done.forced.__dict__ if done.forced else None,
        }
        print(json.dumps(payload, indent=2), file=out)
    else:
        then = f", then migrated up to {done.head}" if done.migrated else ""
        print(
            f"restored {path} (schema revision {done.revision}) into {safe_url(url)}{then}",
            file=out,
        )
    return 0


def needs_experiment(args: argparse.Namespace) -> bool:
    """Whether the subcommand reads the variants file (`admin variants`, `admin assign`)."""
    return args.admin_command in _EXPERIMENT_HANDLERS


async def admin(
    url: str,
    args: argparse.Namespace,
    out: TextIO | None = None,
    *,
    sql_url: str | None = None,
    experiment: Experiment | None = None,
) -> int:
    """Run a parsed `admin` subcommand against the database at `url`; returns the exit status.

    `admin sql` connects with `sql_url` (ADMIN_DATABASE_URL, the read-only role) when given;
    `admin variants` and `admin assign` need the `experiment` (bot.engine.variants).
    """
    out = out or sys.stdout
    if args.admin_command == "export":
        read.episode_filter(args)  # a usage error before anything touches the database
    if args.admin_command == "sql":
        return await read.run_sql(sql_url or url, args, out)
    if args.admin_command == "restore":
        return await recorded_after(
            url, "restore", args.path, lambda: _backup_or_restore(url, args, out)
        )
    if args.admin_command == "backup":
        return await _backup_or_restore(url, args, out)
    if needs_experiment(args) and experiment is None:
        raise AdminError(f"admin {args.admin_command} needs the experiment (VARIANTS_FILE)")
    if make_url(url).get_backend_name() == "sqlite":
        admin_sql.sqlite_path(url)  # a clear error instead of creating an empty database
    engine = make_engine(url)
    try:
        if experiment is not None and needs_experiment(args):
            handler = _EXPERIMENT_HANDLERS[args.admin_command]
            return await recorded(
                engine, args, experiment, lambda: handler(engine, args, out, experiment)
            )
        return await recorded(
            engine, args, None, lambda: _HANDLERS[args.admin_command](engine, args, out)
        )
    except DBAPIError as err:
        raise AdminError(f"database {safe_url(url)}: {hint(err)}") from err
    except BrokenPipeError:
        raise
    except OSError as err:
        raise AdminError(f"cannot reach database {safe_url(url)}: {err}") from err
    finally:
        await engine.dispose()


def admin_sql_url(settings: Settings) -> str:
    """The database URL `admin sql` uses: ADMIN_DATABASE_URL, else the service's own."""
    admin_url = settings.admin_database_url
    if admin_url is not None and admin_url.get_secret_value().strip():
        return admin_url.get_secret_value().strip()
    return settings.db_url


def run_admin(settings: Settings, args: argparse.Namespace) -> int:
    """Run an admin subcommand; errors become one line on stderr and exit status 1.

    A broken VARIANTS_FILE (`admin variants`, `admin assign`) raises ConfigError, which the
    command line reports like any other configuration error (exit status 2).
    """
    experiment = load_experiment(settings, check_model=False) if needs_experiment(args) else None
    try:
        return asyncio.run(
            admin(
                settings.db_url,
                argparse.Namespace(
                    **vars(args), retention_days=settings.retention_days, settings=settings
                ),
                sql_url=admin_sql_url(settings),
                experiment=experiment,
            )
        )
    except VariantChangeError as err:  # bad input to `admin variants add/weight/...`
        print(f"error: {err}", file=sys.stderr)
        return 2
    except AdminError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, UsageError | admin_backup.BackupRefused) else 1
    except BrokenPipeError:
        # `admin export | head` closes the pipe early; that is not an error. Point stdout at
        # /dev/null so that flushing it at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
