"""`python -m bot admin ...`: look at conversations and service health from a terminal.

Every subcommand prints a readable table by default and JSON with `--json`. All of them read the
database named by the settings (DATABASE_URL, or the SQLite file under DATA_DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.admin import access as admin_access
from bot.admin import backup as admin_backup
from bot.admin import export
from bot.admin import sql as admin_sql
from bot.config import Settings, get_settings
from bot.db import assignments, audit
from bot.db import variants as stored_variants
from bot.db.engine import make_engine, make_sessionmaker, safe_url
from bot.db.models import AssignmentSource, AuditSource, Role, SessionStatus
from bot.engine import live
from bot.engine.live import VariantChangeError
from bot.engine.variants import ALLOCATIONS, INFERENCE, Experiment, load_experiment
from bot.reports import admin as reports
from bot.reports.admin import AdminError
from bot.reports.stats import format_stats, stats
from bot.reports.variants import json_ready

MAX_CELL = 60

# --- output helpers ----------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def dump_json(value: Any) -> str:
    """JSON with timestamps as ISO 8601 strings."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, indent=2)


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return f"{value:%Y-%m-%d %H:%M:%S}"


def _cell(value: Any, max_width: int = MAX_CELL) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return _when(value)
    if isinstance(value, bytes | bytearray | memoryview):
        text = "\\x" + bytes(value).hex()
    else:
        text = str(value)
    # One line per row: newlines would break the table apart.
    text = text.replace("\r\n", "\n").replace("\n", " ↵ ").replace("\t", " ")
    if len(text) > max_width:
        text = text[: max_width - 1] + "…"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: numbers right-aligned, long or multi-line cells shortened."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


# --- subcommands -------------------------------------------------------------------------------


async def _stats(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    result = await stats(
        make_sessionmaker(engine), retention_days=getattr(args, "retention_days", None)
    )
    print(dump_json(result) if args.json else format_stats(result), file=out)
    return 0


async def _sessions(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
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


def _indent(text: str, prefix: str) -> str:
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(prefix + line for line in rest)])


async def _show(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
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
            "active (current)" if s.status == SessionStatus.ACTIVE else "ended " + _when(s.ended_at)
        )
        user = f"user {s.user_id}" if s.user_id is not None else "no user id"
        print(
            f"\n== session {s.id} · {state} · {user} · started {_when(s.created_at)} "
            f"· {s.messages} message(s)",
            file=out,
        )
        print(f"persona: {_indent(s.persona, '         ') if s.persona else '(none)'}", file=out)
        read = ""  # the persona the previous reply read (none before the first)
        for m in t.messages:
            note = ""
            if m.reply_persona is not None and m.reply_persona != read:
                # A change reaches the model from the next reply on: shown where it did.
                read = m.reply_persona
                head = "  -- the model reads: "
                print(head + (_indent(read, " " * len(head)) if read else "(none)"), file=out)
            if m.role == Role.BOT:
                parts = []
                if m.latency_ms is not None:
                    parts.append(f"{m.latency_ms:.0f} ms")
                if m.delivered_at is None:
                    parts.append("not delivered")
                note = f"  [{', '.join(parts)}]" if parts else ""
            prefix = f"  {_when(m.created_at)}  {m.role:<4}  "
            print(prefix + _indent(m.text, " " * len(prefix)) + note, file=out)
    return 0


def _export_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class UsageError(AdminError):
    """The command line asks for something impossible (exit status 2, like argparse)."""


EPISODE_FORMATS = ("parlai", "parlai-jsonl")
_EPISODE_FILTERS = ("since", "variant", "min_rating", "votes")


def _episode_filter(args: argparse.Namespace) -> export.EpisodeFilter:
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


async def _export(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    flt = _episode_filter(args)  # before the output file is created
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


def _confirm(question: str) -> bool:
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


async def _forget(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    sessionmaker = make_sessionmaker(engine)
    footprint = await reports.chat_footprint(sessionmaker, args.chat_id)
    summary = (
        f"{footprint.sessions} session(s), {footprint.messages} message(s), "
        f"{footprint.outbox} outbox row(s), {footprint.inbox} inbox row(s)"
    )
    if footprint.total == 0:
        if args.json:
            print(dump_json({"chat_id": args.chat_id, "deleted": asdict(footprint)}), file=out)
        else:
            print(f"nothing stored for chat {args.chat_id}", file=out)
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise AdminError(
                f"chat {args.chat_id} has {summary}; add --yes to delete them without a prompt"
            )
        if not _confirm(f"Delete {summary} of chat {args.chat_id}? This cannot be undone."):
            print("nothing deleted", file=out)
            return 1
    deleted = await reports.forget_chat(sessionmaker, args.chat_id)
    if args.json:
        print(dump_json({"chat_id": args.chat_id, "deleted": asdict(deleted)}), file=out)
    else:
        print(f"forgot chat {args.chat_id}: deleted {summary}", file=out)
    return 0


async def _sql(url: str, args: argparse.Namespace, out: TextIO) -> int:
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


async def _variants(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    change = _VARIANT_CHANGES.get(getattr(args, "variants_command", None) or "")
    if change is not None:
        return await change(engine, args, out, experiment)
    # numpy and scipy load here, not with every `python -m bot` command
    from bot.reports import variants as variant_report

    sessionmaker = make_sessionmaker(engine)
    experiment = await live.current(sessionmaker, experiment, _settings(args))
    report = await variant_report.variant_report(sessionmaker, experiment)
    if args.plot:
        try:
            await asyncio.to_thread(variant_report.plot_variants, report, args.plot)
        except RuntimeError as err:  # matplotlib is missing
            raise AdminError(str(err)) from err
        except OSError as err:
            raise AdminError(f"cannot write {args.plot}: {err}") from err
    if args.json:
        print(dump_json(variant_report.report_json(report)), file=out)
    else:
        print(variant_report.format_variant_report(report), file=out)
    if args.plot:
        # stderr, so that stdout stays the report alone (and valid JSON with --json)
        out.flush()
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


# --- variants add / weight / promote / remove / allocation / reload / list ---------------------

# `admin variants add` options: flag -> the variants file's key (bot.engine.variants).
ADD_OPTIONS = {
    "inference": str,
    "beam_size": int,
    "beam_min_length": int,
    "beam_block_ngram": int,
    "beam_context_block_ngram": int,
    "topk": int,
    "topp": float,
    "temperature": float,
    "beam_delay": int,
    "threads": int,
    # MODEL_BACKEND=ray: the variant's deployment
    "replicas": int,
    "num_cpus": float,
    "num_gpus": float,
}
FOLLOW_NOTE = "every running replica follows within a few seconds"
FORCE_HELP = (
    "make the change even though no variant left with a weight above 0 can serve (a model "
    "incomplete here, or failing to load on every running replica): new chats then go to the "
    "control until one can"
)


def _settings(args: argparse.Namespace) -> Settings:
    settings = getattr(args, "settings", None)
    return settings if isinstance(settings, Settings) else get_settings()


def _experiment_json(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment": experiment.name,
        "version": experiment.version,
        "allocation": experiment.allocation,
        "control": experiment.control.name,
        "variants": [
            {
                "name": v.name,
                "model": v.model,
                "weight": v.weight,
                "control": v.control,
                "options": {k: o for k, o in v.options.items() if k != "model"},
            }
            for v in experiment.variants
        ],
    }


def _changed(
    out: TextIO, args: argparse.Namespace, experiment: Experiment, line: str, **extra: Any
) -> int:
    if args.json:
        print(dump_json({**_experiment_json(experiment), **extra}), file=out)
    else:
        print(
            f"{line} (experiment {experiment.name} version {experiment.version}; {FOLLOW_NOTE})",
            file=out,
        )
    return 0


def _model_path(model: str) -> str:
    """A model file as the replicas read it: a directory holding `model.opt` means its
    `model`, and a local path is made absolute (the replicas do not share this cwd)."""
    if model.startswith("zoo:"):
        return model
    path = Path(model).expanduser()
    if path.is_dir() and (path / "model.opt").exists():
        path = path / "model"
    return str(path.resolve()) if Path(str(path) + ".opt").exists() else model


async def _variants_add(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    table: dict[str, object] = {"name": args.name, "model": _model_path(args.model)}
    if args.weight is not None:
        table["weight"] = live.check_weight(args.weight)
    table.update({key: getattr(args, key) for key in ADD_OPTIONS if getattr(args, key) is not None})
    experiment = await live.add(make_sessionmaker(engine), seed, _settings(args), table)
    variant = experiment.get(args.name)
    assert variant is not None
    return _changed(
        out,
        args,
        experiment,
        f"added {variant.name} ({variant.model}, weight {variant.weight:g}); new chats "
        "may go to it once a replica has loaded it",
    )


async def _variants_weight(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, old, forced = await live.set_weight(
        make_sessionmaker(engine), seed, _settings(args), args.name, args.weight, force=args.force
    )
    drained = " (drained: no new chats)" if args.weight == 0 else ""
    return _changed(
        out,
        args,
        experiment,
        f"{args.name}: weight {old:g} -> {args.weight:g}{drained}; existing chats keep "
        "their variant" + (f"; {forced}" if forced else ""),
        previous_weight=old,
        **({"forced": forced} if forced else {}),
    )


async def _variants_promote(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, previous = await live.promote(
        make_sessionmaker(engine), seed, _settings(args), args.name
    )
    line = (
        f"{args.name} is the control already"
        if previous == args.name
        else f"{args.name} is the control now (was {previous})"
    )
    return _changed(out, args, experiment, line, previous_control=previous)


async def _variants_remove(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, forced = await live.remove(
        make_sessionmaker(engine), seed, _settings(args), args.name, force=args.force
    )
    return _changed(
        out,
        args,
        experiment,
        f"removed {args.name}: no new chats; its worker stops once its turns in flight are "
        "answered, and each of its chats is assigned again at its next turn"
        + (f"; {forced}" if forced else ""),
        **({"forced": forced} if forced else {}),
    )


async def _variants_allocation(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, previous = await live.set_allocation(
        make_sessionmaker(engine), seed, _settings(args), args.allocation
    )
    return _changed(
        out,
        args,
        experiment,
        f"allocation {previous} -> {args.allocation} (new chats only)",
        previous_allocation=previous,
    )


async def _variants_reload(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment, changes = await live.reload(make_sessionmaker(engine), seed, _settings(args))
    what = "; ".join(changes) if changes else "nothing differed"
    return _changed(
        out, args, experiment, f"the database now matches the file ({what})", changes=changes
    )


async def _variants_list(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    experiment = await live.current(make_sessionmaker(engine), seed, _settings(args))
    if args.all_versions:
        return await _variants_history(engine, args, out, experiment)
    if args.json:
        print(dump_json(_experiment_json(experiment)), file=out)
        return 0
    stored = f"version {experiment.version}" if experiment.version else "not stored yet"
    print(f"experiment {experiment.name} ({stored}), {experiment.allocation} allocation", file=out)
    rows = [
        (
            v.name + (" (control)" if v.control else ""),
            v.weight,
            v.model,
            " ".join(f"{k}={o}" for k, o in sorted(v.options.items()) if k != "model"),
        )
        for v in experiment.variants
    ]
    print(format_table(["variant", "weight", "model", "options"], rows), file=out)
    return 0


async def _variants_history(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    """Every identity of every variant (docs/variants.md, Variant identities)."""
    async with make_sessionmaker(engine)() as db:
        identities = await stored_variants.history(db, experiment.name)
    if args.json:
        data = [
            {
                **{k: getattr(i, k) for k in ("id", "name", "model", "options", "replies")},
                "created_at": i.created_at.isoformat(),
                "retired_at": None if i.retired_at is None else i.retired_at.isoformat(),
                "votes_up": i.votes_up,
                "votes_down": i.votes_down,
            }
            for i in identities
        ]
        print(dump_json({"experiment": experiment.name, "identities": data}), file=out)
        return 0
    print(
        f"experiment {experiment.name}: every identity of its variants (the report counts the "
        "current ones only)",
        file=out,
    )
    rows = [
        (
            i.id,
            i.name,
            i.model or "BOT_MODEL",
            " ".join(f"{k}={o}" for k, o in sorted(i.options.items())),
            f"{i.created_at:%Y-%m-%d %H:%M}",
            "current" if i.retired_at is None else f"{i.retired_at:%Y-%m-%d %H:%M}",
            f"{i.replies:,}",
            f"{i.votes_up:,}",
            f"{i.votes_down:,}",
        )
        for i in identities
    ]
    columns = ["identity", "variant", "model", "options", "since", "retired", "replies", "up"]
    print(format_table([*columns, "down"], rows), file=out)
    return 0


# `admin variants autopilot on` options: flag -> bot.service.autopilot.Policy field.
AUTOPILOT_OPTIONS = {
    "min_chats": int,
    "min_replies": int,
    "distinct_ratio": float,
    "repetition_margin": float,
    "safety_margin": float,
    "failed_margin": float,
    "latency_ratio": float,
    "interval_s": float,
}


def _autopilot_policy(args: argparse.Namespace) -> Any:
    from bot.service.autopilot import Policy, PolicyError

    given = {k: getattr(args, k) for k in AUTOPILOT_OPTIONS if getattr(args, k) is not None}
    try:
        return Policy(**given)
    except PolicyError as err:
        raise UsageError(str(err)) from err


async def _variants_autopilot(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    sessionmaker = make_sessionmaker(engine)
    if args.state == "check":
        return await _autopilot_dry_run(sessionmaker, args, out, seed)
    given = [f"--{k.replace('_', '-')}" for k in AUTOPILOT_OPTIONS if getattr(args, k) is not None]
    if args.state == "off" and given:
        raise UsageError(f"{', '.join(given)} set(s) the policy: use them with `autopilot on`")
    policy = _autopilot_policy(args).to_json() if args.state == "on" else None
    experiment, previous = await live.set_autopilot(sessionmaker, seed, _settings(args), policy)
    if policy is None:
        line = "autopilot off" + ("" if previous is not None else " (it was off)")
        line += "; its decisions stay as they are (undo one with `admin variants weight/promote`)"
    else:
        line = "autopilot on: " + ", ".join(f"{k} {v:g}" for k, v in policy.items())
        line += "; every replica checks within a few seconds and then every interval_s"
    return _changed(out, args, experiment, line, autopilot=policy, previous_autopilot=previous)


async def _autopilot_dry_run(
    sessionmaker: Any, args: argparse.Namespace, out: TextIO, seed: Experiment
) -> int:
    """What a check would decide now (nothing is changed): each candidate's verdict."""
    from bot.db import autopilot as autopilot_rows
    from bot.service.autopilot import Policy, evaluate

    experiment = await live.current(sessionmaker, seed, _settings(args))
    async with sessionmaker() as db:
        state = await autopilot_rows.policy(db, experiment.name)
        given = any(getattr(args, k) is not None for k in AUTOPILOT_OPTIONS)
        stored_policy = state[1] if state is not None else None
        policy = (
            Policy.from_json(stored_policy)
            if stored_policy is not None and not given
            else _autopilot_policy(args)
        )
        candidates = [v.name for v in experiment.variants if not v.control and v.weight > 0]
        judged = await evaluate(db, experiment.name, experiment.control.name, candidates, policy)
    if args.json:
        rows = [
            {
                "variant": j.variant,
                "action": j.action,
                "reason": j.reason,
                "breaches": list(j.breaches),
                "lift": asdict(j.lift),
                "guards": {"control": asdict(j.control_guards), "candidate": asdict(j.guards)},
            }
            for j in judged
        ]
        payload = {"experiment": experiment.name, "policy": policy.to_json(), "candidates": rows}
        print(dump_json(json_ready(payload)), file=out)
        return 0
    state_word = "on" if stored_policy is not None else "off"
    print(
        f"autopilot {state_word}; a check now (nothing is changed) against control "
        f"{experiment.control.name}:",
        file=out,
    )
    if not judged:
        print("  no candidate (no variant but the control has a weight above 0)", file=out)
    for j in judged:
        print(f"  {j.variant}: {j.action or 'no decision'}: {j.reason}", file=out)
    return 0


_VARIANT_CHANGES: dict[str, Callable[..., Awaitable[int]]] = {
    "add": _variants_add,
    "weight": _variants_weight,
    "promote": _variants_promote,
    "remove": _variants_remove,
    "allocation": _variants_allocation,
    "reload": _variants_reload,
    "list": _variants_list,
    "autopilot": _variants_autopilot,
}


async def _assign(
    engine: AsyncEngine, args: argparse.Namespace, out: TextIO, experiment: Experiment
) -> int:
    experiment = await live.current(make_sessionmaker(engine), experiment, _settings(args))
    if experiment.get(args.variant) is None:
        raise AdminError(
            f"unknown variant {args.variant!r}; the variants of experiment {experiment.name} "
            f"are: {', '.join(experiment.names)}"
        )
    async with make_sessionmaker(engine).begin() as db:
        previous = await assignments.variant_of(db, args.chat_id)
        choice = assignments.Choice(experiment.name, args.variant)
        await assignments.set_variant(db, args.chat_id, choice, AssignmentSource.ADMIN)
    if args.json:
        payload = {
            "chat_id": args.chat_id,
            "experiment": experiment.name,
            "variant": args.variant,
            "previous": previous,
            "source": str(AssignmentSource.ADMIN),
        }
        print(dump_json(payload), file=out)
    elif previous is None:
        print(f"chat {args.chat_id}: assigned to {args.variant} (it had no variant)", file=out)
    elif previous == args.variant:
        print(f"chat {args.chat_id}: already on {args.variant} (now source admin)", file=out)
    else:
        print(
            f"chat {args.chat_id}: moved from {previous} to {args.variant} "
            "(its next reply comes from the new variant)",
            file=out,
        )
    return 0


async def _audit(engine: AsyncEngine, args: argparse.Namespace, out: TextIO) -> int:
    async with make_sessionmaker(engine)() as db:
        rows = await audit.recent(db, args.limit)
    if args.json:
        print(dump_json([asdict(r) for r in rows]), file=out)
        return 0
    if not rows:
        print("no admin changes recorded", file=out)
        return 0
    table = [
        (
            r.id,
            r.at,
            r.actor,
            r.source,
            r.action,
            r.target,
            " ".join(f"{k}={v}" for k, v in r.details.items()),
            r.result,
        )
        for r in rows
    ]
    columns = ["id", "at", "actor", "source", "action", "target", "details", "result"]
    print(format_table(columns, table), file=out)
    return 0


# --- the audit log: every subcommand that changes data is recorded (bot/db/audit.py) ----------

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


async def _recorded(
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
        shown = _hint(err) if isinstance(err, DBAPIError) else str(err) or type(err).__name__
        for name in unrecorded:  # the messages say "chat N"; a count that equals N stays
            value = re.escape(str(getattr(args, name)))
            shown = re.sub(rf"\bchat {value}(?!\d)", f"chat <{name}>", shown)
        await _finish(sessionmaker, pending, audit.outcome(error=shown))
        raise
    await _finish(sessionmaker, pending, audit.outcome(status))
    return status


async def _restore_recorded(url: str, args: argparse.Namespace, out: TextIO) -> int:
    """`admin restore`, recorded after it ran: the database it replaces may have no audit
    table yet (an empty one), and what it had is gone once restored, so the row goes into the
    restored database (at this release's revision by then). A refused restore changed
    nothing and is recorded in the database as it was, when it has the table."""
    status: int | None = None
    error: str | None = None
    try:
        status = await admin_backup.run(url, args, out)
        return status
    except BaseException as err:
        error = str(err) or type(err).__name__
        raise
    finally:
        if status is not None or error is not None:
            await _record_once(url, "restore", args.path, audit.outcome(status, error))


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
ExperimentHandler = Callable[[AsyncEngine, argparse.Namespace, TextIO, Experiment], Awaitable[int]]

_HANDLERS: dict[str, Handler] = {
    "stats": _stats,
    "sessions": _sessions,
    "show": _show,
    "export": _export,
    "forget": _forget,
    "audit": _audit,
    "access": admin_access.run,
}

# Subcommands that need the experiment (VARIANTS_FILE).
_EXPERIMENT_HANDLERS: dict[str, ExperimentHandler] = {
    "variants": _variants,
    "assign": _assign,
}


def _hint(err: DBAPIError) -> str:
    text = str(err.orig) if err.orig is not None else str(err)
    if "no such table" in text or "does not exist" in text:
        return f"{text} (is the schema there? run `python -m bot db upgrade`)"
    return text


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
        _episode_filter(args)  # a usage error before anything touches the database
    if args.admin_command == "sql":
        return await _sql(sql_url or url, args, out)
    if args.admin_command == "restore":
        return await _restore_recorded(url, args, out)
    if args.admin_command == "backup":
        return await admin_backup.run(url, args, out)
    if needs_experiment(args) and experiment is None:
        raise AdminError(f"admin {args.admin_command} needs the experiment (VARIANTS_FILE)")
    if make_url(url).get_backend_name() == "sqlite":
        admin_sql.sqlite_path(url)  # a clear error instead of creating an empty database
    engine = make_engine(url)
    try:
        if experiment is not None and needs_experiment(args):
            handler = _EXPERIMENT_HANDLERS[args.admin_command]
            return await _recorded(
                engine, args, experiment, lambda: handler(engine, args, out, experiment)
            )
        return await _recorded(
            engine, args, None, lambda: _HANDLERS[args.admin_command](engine, args, out)
        )
    except DBAPIError as err:
        raise AdminError(f"database {safe_url(url)}: {_hint(err)}") from err
    except BrokenPipeError:
        raise
    except OSError as err:
        raise AdminError(f"cannot reach database {safe_url(url)}: {err}") from err
    finally:
        await engine.dispose()


# --- argparse ----------------------------------------------------------------------------------


# Counts go to SQLite and PostgreSQL as integers and to fetchmany() as a C int: a row count
# far beyond any table stays below both limits.
MAX_COUNT = 1_000_000_000
# PostgreSQL's statement_timeout is an int of milliseconds.
MAX_TIMEOUT_S = 2_147_483
# Telegram ids are stored as 64-bit integers.
ID_RANGE = range(-(2**63), 2**63)


def _whole(value: str, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {value!r} is not a whole number") from None


def _positive(value: str) -> int:
    n = _whole(value, "not a count")
    if not 1 <= n <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be 1 or more, at most {MAX_COUNT:,}")
    return n


def _chat_id(value: str) -> int:
    n = _whole(value, "not a chat id")
    if n not in ID_RANGE:
        raise argparse.ArgumentTypeError(f"not a chat id: {value} is outside the 64-bit range")
    return n


def _seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < s <= MAX_TIMEOUT_S:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"seconds must be above 0, at most {MAX_TIMEOUT_S:,}")
    return s


def _since(value: str) -> datetime:
    text = value.strip()
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        try:
            return datetime.now(UTC) - timedelta(seconds=float(text[:-1]) * units[text[-1]])
        except OverflowError:  # before the year 1, or beyond timedelta's range
            raise argparse.ArgumentTypeError(
                f"{text} is too far back (before the year 1): give a shorter span or a date"
            ) from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected a date (2025-01-31), an ISO time (2025-01-31T12:00:00+00:00) or a span "
            "such as 7d, 12h, 30m"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _rating(value: str) -> int:
    n = int(value)
    if not 1 <= n <= 5:
        raise argparse.ArgumentTypeError("ratings go from 1 to 5")
    return n


def add_admin_parser(sub: Any) -> None:
    """Register `admin` and its subcommands on the top-level subparsers."""
    admin_parser = sub.add_parser(
        "admin",
        help="inspect conversations and service health in the database",
        description="Look at conversations and service health in the bot's database "
        "(DATABASE_URL, or the SQLite file under DATA_DIR). Timestamps are UTC.",
    )
    cmds = admin_parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)

    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="machine-readable output")

    cmds.add_parser(
        "stats",
        parents=[as_json],
        help="chats, sessions, messages, reply latency, undelivered replies, failed updates",
    )

    sessions = cmds.add_parser(
        "sessions", parents=[as_json], help="conversations, most recently active first"
    )
    sessions.add_argument("--active", action="store_true", help="only active conversations")
    sessions.add_argument(
        "--limit", type=_positive, default=20, metavar="N", help="at most N rows (default 20)"
    )

    show = cmds.add_parser(
        "show", parents=[as_json], help="transcripts of a chat's conversations, with personas"
    )
    show.add_argument("chat_id", type=_chat_id, metavar="CHAT_ID")

    exporter = cmds.add_parser(
        "export",
        help="every message as JSONL or CSV, or conversations as ParlAI training episodes",
        description="Without --format, or with jsonl or csv: every message (of one chat or "
        "all), one row each. With --format parlai (ParlAI's dialog text format, the fromfile "
        "teacher) or parlai-jsonl (ParlAI's Conversations JSONL, the jsonfile teacher): one "
        "episode per conversation, one example per bot reply, with its votes, the "
        "conversation's rating and arena outcome as fields; the filters apply to these. "
        "Only what is stored now is exported: what /forget or RETENTION_DAYS deleted is gone.",
    )
    exporter.add_argument("chat_id", type=_chat_id, nargs="?", default=None, metavar="CHAT_ID")
    exporter.add_argument("--format", choices=("jsonl", "csv", *EPISODE_FORMATS), default="jsonl")
    exporter.add_argument(
        "--output", "-o", metavar="FILE", default=None, help="write here (default: stdout)"
    )
    exporter.add_argument(
        "--since",
        type=_since,
        default=None,
        metavar="WHEN",
        help="conversations active since WHEN: a date or ISO time (UTC unless it says), or "
        "a span back from now such as 7d or 12h",
    )
    exporter.add_argument(
        "--variant", default=None, metavar="NAME", help="only the replies of this variant"
    )
    exporter.add_argument(
        "--min-rating",
        type=_rating,
        default=None,
        metavar="N",
        help="only conversations rated N or more (1-5; unrated ones are left out)",
    )
    exporter.add_argument(
        "--votes",
        choices=[v.value for v in export.VoteFilter],
        default=None,
        help="only replies with more 👍 than 👎 (up), more 👎 than 👍 (down), or any vote",
    )

    forget = cmds.add_parser(
        "forget", parents=[as_json], help="delete everything stored for a chat (like /forget)"
    )
    forget.add_argument("chat_id", type=_chat_id, metavar="CHAT_ID")
    forget.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    variants = cmds.add_parser(
        "variants",
        parents=[as_json],
        help="the A/B experiment: chats, replies, votes, ratings, latency per variant",
        description="Without CHANGE: the report. Per model variant (as stored in the "
        "database, seeded from VARIANTS_FILE): assigned chats, replies, 👍/👎 votes "
        "with the 👍 rate (one user counts for at most 10 votes) and its 95% chat-level "
        "interval, 1-5 ratings with their mean and 95% interval, reply latency p50/p95, model "
        "time p50 and reply length; each variant against the control (the 👍 lift with its "
        "always-valid bound and p-value, which may be read at any time, and its fixed-horizon "
        "interval and p-value, read once; difference in mean rating), and a "
        "sample-ratio-mismatch check of the hash-assigned chats against the weights (or the "
        "probabilities recorded at assignment), inverse-propensity 👍 rates where they are "
        "recorded. With CHANGE: add, weight, promote, remove, allocation, reload, list.",
    )
    variants.add_argument(
        "--plot", metavar="FILE.png", default=None, help="also draw the 👍 rates (needs matplotlib)"
    )
    _add_variant_changes(variants, as_json)

    assign = cmds.add_parser(
        "assign",
        parents=[as_json],
        help="move a chat to a variant of the experiment",
        description="Assign (or move) a chat to a variant of VARIANTS_FILE; its next reply "
        "comes from that variant. Recorded with source 'admin'.",
    )
    assign.add_argument("chat_id", type=_chat_id, metavar="CHAT_ID")
    assign.add_argument("variant", metavar="VARIANT")

    admin_access.add_parser(cmds, as_json)

    audit_log = cmds.add_parser(
        "audit",
        parents=[as_json],
        help="the admin changes recorded, newest first: who, when, what, the result",
        description="Every change made with `admin` (variants, forget, assign, ...) and every "
        "decision of the autopilot: who (the OS user, a Telegram admin's id, or "
        "autopilot@<replica>), when (UTC), the command's arguments and its result (ok, exit N, "
        "error: ...; 'pending' if the command died before its result was written).",
    )
    audit_log.add_argument(
        "--limit", type=_positive, default=50, metavar="N", help="at most N rows (default 50)"
    )

    sql = cmds.add_parser(
        "sql",
        parents=[as_json],
        help="run one read-only SQL query",
        description="Run one SQL query on a connection the database keeps read-only: SQLite "
        "mode=ro with an authorizer; on PostgreSQL a READ ONLY transaction of a role that can "
        "only read (ADMIN_DATABASE_URL, made by `python -m bot db readonly-role NAME`; a "
        "superuser or a role that can write is refused). Writes, statements that return no "
        "rows, and multiple statements are refused.",
    )
    sql.add_argument("query", metavar="SQL")
    sql.add_argument("--max-rows", type=_positive, default=1000, metavar="N", help="default 1000")
    sql.add_argument("--timeout", type=_seconds, default=60.0, metavar="SECONDS", help="default 60")

    backup = cmds.add_parser(
        "backup",
        parents=[as_json],
        help="copy the database to a file, consistently, while the service runs",
        description="SQLite: a copy made with SQLite's online backup API (one moment's "
        "database, while the service writes). PostgreSQL: a pg_dump custom-format archive "
        "(needs pg_dump: apt-get install postgresql-client). PATH.json, beside it, records the "
        "schema revision, size and SHA-256. Written to a scratch file, renamed when complete.",
    )
    backup.add_argument(
        "path",
        metavar="PATH",
        help="the file to write, or a directory: then a new file bot-YYYYMMDDTHHMMSSZ.sqlite3 "
        "(or .pgdump) in it",
    )
    backup.add_argument(
        "--keep",
        type=_positive,
        default=None,
        metavar="N",
        help="PATH a directory: then delete all but its N newest time-stamped backups",
    )
    restore = cmds.add_parser(
        "restore",
        parents=[as_json],
        help="replace the database with a backup (stop the service first)",
        description="Replace the database's contents with a backup made by `admin backup`. "
        "Refused while a replica's heartbeat or a chat lease is live (stop the service, or "
        "--force), for a backup of a schema revision newer than this release's, or of the "
        "other kind of database; a backup of an older revision is migrated up after.",
    )
    restore.add_argument("path", metavar="PATH")
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore even though a service seems to use the database (live heartbeat or lease)",
    )


def _weight(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None


def _add_variant_changes(
    variants: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    """`admin variants add/weight/promote/remove/allocation/reload/list`."""
    changes = variants.add_subparsers(dest="variants_command", metavar="CHANGE")
    add = changes.add_parser(
        "add",
        parents=[as_json],
        help="add a variant (new chats may go to it; existing chats keep theirs)",
        description="Add a variant to the experiment in the database; every running replica "
        "starts its worker within a few seconds, and new chats go to it by its weight (or the "
        "bandit). The options are the variants file's keys, checked with the same bounds.",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help="a model file (or the directory holding model.opt) or a zoo: path",
    )
    add.add_argument("--weight", type=_weight, default=None, metavar="W", help="default 1")
    add.add_argument("--inference", choices=INFERENCE, default=None)
    for key, kind in ADD_OPTIONS.items():
        if key == "inference":
            continue
        add.add_argument(
            "--" + key.replace("_", "-"), dest=key, type=kind, default=None, metavar="N"
        )
    weight = changes.add_parser(
        "weight",
        parents=[as_json],
        help="set a variant's weight (new chats only; 0 drains it)",
        description="Set a variant's share of new chats; existing chats keep their variant. "
        "0 drains it: no new chats.",
    )
    weight.add_argument("name", metavar="NAME")
    weight.add_argument("weight", type=_weight, metavar="W")
    weight.add_argument("--force", action="store_true", help=FORCE_HELP)
    promote = changes.add_parser(
        "promote", parents=[as_json], help="make a variant the control (the report's baseline)"
    )
    promote.add_argument("name", metavar="NAME")
    remove = changes.add_parser(
        "remove",
        parents=[as_json],
        help="take a variant out (drains: no new chats, its worker stops after its turns)",
        description="Take a variant out of the experiment: no new chats at once; every "
        "replica stops its worker once the turns in flight are answered, and each of its "
        "chats is assigned again by the allocation at its next turn. Not the control (promote "
        "another first), not the last variant.",
    )
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--force", action="store_true", help=FORCE_HELP)
    allocation = changes.add_parser(
        "allocation",
        parents=[as_json],
        help="how new chats are split: weights, or a thompson bandit on the 👍 rates",
    )
    allocation.add_argument("allocation", choices=ALLOCATIONS, metavar="{weights,thompson}")
    changes.add_parser(
        "reload",
        parents=[as_json],
        help="make the database's variants match VARIANTS_FILE (one change)",
    )
    listing = changes.add_parser(
        "list", parents=[as_json], help="the variants as stored: models, options"
    )
    listing.add_argument(
        "--all-versions",
        action="store_true",
        help="every identity each variant has had (a name added again, or given another "
        "model, starts a new one), with its replies and votes",
    )
    autopilot = changes.add_parser(
        "autopilot",
        parents=[as_json],
        help="promote a winning candidate and roll back one that breaks a guard, on its own",
        description="on: every replica checks every --interval-s seconds and promotes a "
        "candidate (it becomes the control and takes every new chat) when the always-valid "
        "95%% lower bound on its 👍 lift over the control is above 0 and no guard regressed, "
        "or rolls it back (weight 0) when a guard breaches; each decision is stored with its "
        "figures and reason (shown by `admin variants`). off: no more decisions (the ones "
        "made stay). check: what a check would decide now, changing nothing. The options set "
        "the policy (docs/variants.md); unset ones take their defaults.",
    )
    autopilot.add_argument("state", choices=("on", "off", "check"), metavar="{on,off,check}")
    defaults = {
        "min_chats": "voting chats on each side before a promotion (default 30, at least 5)",
        "min_replies": "replies on each side before the guards are judged (default 200)",
        "distinct_ratio": "breach below this share of the control's distinct replies (0.9)",
        "repetition_margin": "breach above the control's repetitive share + this (0.05)",
        "safety_margin": "breach above the control's safety-gate share + this (0.02)",
        "failed_margin": "breach above the control's failed-turn share + this (0.02)",
        "latency_ratio": "breach above this multiple of the control's latency p95 (1.5)",
        "interval_s": "seconds between two checks of a replica (default 60)",
    }
    for key, kind in AUTOPILOT_OPTIONS.items():
        autopilot.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            type=kind,
            default=None,
            metavar="N" if kind is int else "X",
            help=defaults[key],
        )


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
