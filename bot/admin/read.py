"""The `admin` subcommands that only read: stats, sessions, show, export, sql, audit and the
variants report.

Each prints a readable table by default and JSON with `--json`, read from the database named by
the settings (DATABASE_URL, or the SQLite file under DATA_DIR); `sql` reads through the
read-only connection (ADMIN_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine

from bot.admin import export
from bot.admin import sql as admin_sql
from bot.admin.common import UsageError, dump_json, format_table, indent, settings_of, when
from bot.db import audit
from bot.db.engine import make_sessionmaker
from bot.db.models import Role, SessionStatus
from bot.engine import live
from bot.engine.variants import Experiment
from bot.reports import admin as reports
from bot.reports.admin import AdminError
from bot.reports.stats import format_stats, stats

EPISODE_FORMATS = ("parlai", "parlai-jsonl")
_EPISODE_FILTERS = ("since", "variant", "min_rating", "votes")


async def run_stats(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    result = await stats(
        make_sessionmaker(engine), retention_days=getattr(args, "retention_days", None)
    )
    print(dump_json(result) if args.json else format_stats(result), file=out)
    return 0


async def run_sessions(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    rows = await reports.list_sessions(
        make_sessionmaker(engine), active_only=args.active, limit=args.limit
    )
    if args.json:
        print(dump_json([asdict(r) for r in rows]), file=out)
        return 0
    if not rows:
        print("no active sessions" if args.active else "no sessions", file=out)
        return 0
    columns = ["id", "chat_id", "user_id", "status", "messages", "last_active", "persona"]
    table = [
        (r.id, r.chat_id, r.user_id, r.status, r.messages, r.updated_at, r.persona or "(none)")
        for r in rows
    ]
    print(format_table(columns, table), file=out)
    return 0


async def run_show(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    transcripts = await reports.chat_transcripts(make_sessionmaker(engine), args.chat_id)
    if args.json:
        print(dump_json([asdict(t) for t in transcripts]), file=out)
        return 0 if transcripts else 1
    if not transcripts:
        print(f"no conversations stored for chat {args.chat_id}", file=out)
        return 1
    print(f"chat {args.chat_id}: {len(transcripts)} conversation(s), oldest first", file=out)
    for t in transcripts:
        s = t.session
        state = (
            "active (current)" if s.status == SessionStatus.ACTIVE else "ended " + when(s.ended_at)
        )
        user = f"user {s.user_id}" if s.user_id is not None else "no user id"
        print(
            f"\n== session {s.id} · {state} · {user} · started {when(s.created_at)} "
            f"· {s.messages} message(s)",
            file=out,
        )
        print(f"persona: {indent(s.persona, '         ') if s.persona else '(none)'}", file=out)
        read = ""  # the persona the previous reply read (none before the first)
        for m in t.messages:
            note = ""
            if m.reply_persona is not None and m.reply_persona != read:
                # A change reaches the model from the next reply on: shown where it did.
                read = m.reply_persona
                head = "  -- the model reads: "
                print(head + (indent(read, " " * len(head)) if read else "(none)"), file=out)
            if m.role == Role.BOT:
                parts = []
                if m.latency_ms is not None:
                    parts.append(f"{m.latency_ms:.0f} ms")
                if m.delivered_at is None:
                    parts.append("not delivered")
                note = f"  [{', '.join(parts)}]" if parts else ""
            prefix = f"  {when(m.created_at)}  {m.role:<4}  "
            print(prefix + indent(m.text, " " * len(prefix)) + note, file=out)
    return 0


def _export_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def episode_filter(args: argparse.Namespace) -> export.EpisodeFilter:
    """`admin export`'s filters; a UsageError where they are given without an episode format."""
    given = [f"--{name.replace('_', '-')}" for name in _EPISODE_FILTERS if getattr(args, name)]
    if args.format not in EPISODE_FORMATS and given:
        raise UsageError(
            f"{', '.join(given)} filter(s) conversations for training: use them with "
            "--format parlai or --format parlai-jsonl"
        )
    return export.EpisodeFilter(
        chat_id=args.chat_id,
        since=args.since,
        variant=args.variant,
        min_rating=args.min_rating,
        votes=export.VoteFilter(args.votes) if args.votes else None,
    )


async def _export_episodes(
    engine: AsyncEngine, args: argparse.Namespace, flt: export.EpisodeFilter, target: TextIO
) -> tuple[int, int]:
    episodes = examples = 0
    async for episode in export.episodes(engine, flt):  # a conversation may be several
        if args.format == "parlai":
            for line in export.parlai_lines(episode):
                target.write(line + "\n")
        else:
            target.write(export.conversation_json(episode) + "\n")
        episodes += 1
        examples += len(episode.examples)
    return episodes, examples


async def run_export(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    flt = episode_filter(args)  # before the output file is created
    target: TextIO
    if args.output and args.output != "-":
        target = await asyncio.to_thread(open, Path(args.output), "w", encoding="utf-8", newline="")
    else:
        target = out
    count = 0
    try:
        if args.format in EPISODE_FORMATS:
            episodes, examples = await _export_episodes(engine, args, flt, target)
            where = f" to {args.output}" if target is not out else ""
            print(
                f"exported {episodes} episode(s), {examples} reply(ies){where}",
                file=sys.stderr,
            )
            return 0
        writer = csv.writer(target) if args.format == "csv" else None
        if writer is not None:
            writer.writerow(reports.EXPORT_COLUMNS)
        async for row in reports.export_rows(engine, args.chat_id):
            values = [_export_value(getattr(row, c)) for c in reports.EXPORT_COLUMNS]
            if writer is not None:
                writer.writerow(values)
            else:
                record = dict(zip(reports.EXPORT_COLUMNS, values, strict=True))
                target.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    finally:
        if target is not out:
            target.close()
    where = f" to {args.output}" if target is not out else ""
    # The summary goes to stderr so that stdout stays a clean JSONL/CSV stream.
    print(f"exported {count} message(s){where}", file=sys.stderr)
    return 0


async def run_sql(url: str, args: argparse.Namespace, out: TextIO) -> int:
    result = await admin_sql.readonly_sql(
        url, args.query, max_rows=args.max_rows, timeout_s=args.timeout
    )
    if args.json:
        payload = {"columns": result.columns, "rows": result.rows, "truncated": result.truncated}
        print(dump_json(payload), file=out)
        return 0
    if not result.columns:
        print("(statement returned no rows)", file=out)
        return 0
    print(format_table(result.columns, result.rows), file=out)
    more = f", stopped at --max-rows {args.max_rows}" if result.truncated else ""
    print(f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''}{more})", file=out)
    return 0


def _details(details: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in details.items())


async def run_audit(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    async with make_sessionmaker(engine)() as db:
        rows = await audit.recent(db, args.limit)
    if args.json:
        print(dump_json([asdict(r) for r in rows]), file=out)
        return 0
    if not rows:
        print("no admin changes recorded", file=out)
        return 0
    columns = ["id", "at", "actor", "source", "action", "target", "details", "result"]
    table = [
        [getattr(r, c) if c != "details" else _details(r.details) for c in columns] for r in rows
    ]
    print(format_table(columns, table), file=out)
    return 0


async def run_variants_report(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    """`admin variants` without CHANGE: the experiment's report (bot/reports/variants.py)."""
    # numpy and scipy load here, not with every `python -m bot` command
    from bot.reports import variants as variant_report
    from bot.reports.variants_json import report_json
    from bot.reports.variants_text import format_variant_report, plot_variants

    sessionmaker = make_sessionmaker(engine)
    experiment = await live.current(sessionmaker, experiment, settings_of(args))
    report = await variant_report.variant_report(sessionmaker, experiment)
    if args.plot:
        try:
            await asyncio.to_thread(plot_variants, report, args.plot)
        except RuntimeError as err:  # matplotlib is missing
            raise AdminError(str(err)) from err
        except OSError as err:
            raise AdminError(f"cannot write {args.plot}: {err}") from err
    if args.json:
        print(dump_json(report_json(report)), file=out)
    else:
        print(format_variant_report(report), file=out)
    if args.plot:
        # stderr, so that stdout stays the report alone (and valid JSON with --json)
        out.flush()
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
