"""The argument parser of `python -m bot admin`: its subcommands, one small builder per group,
and the argument types that turn what an operator types into checked values (a bad one is a
usage error, exit status 2, never a traceback).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.admin import access as admin_access
from bot.admin import export
from bot.admin.changes import ADD_OPTIONS, AUTOPILOT_OPTIONS
from bot.admin.read import EPISODE_FORMATS
from bot.engine.variants import ALLOCATIONS, INFERENCE

FORCE_HELP = (
    "make the change even though no variant left with a weight above 0 can serve (a model "
    "incomplete here, or failing to load on every running replica): new chats then go to the "
    "control until one can"
)


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


def _weight(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None


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
    for add in _GROUPS:
        add(cmds, as_json)


def _add_overview(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin stats`, `admin sessions` and `admin show`: the looks at conversations."""
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


def _add_export(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin export`: messages as JSONL or CSV, or conversations as training episodes."""
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


def _add_forget(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin forget CHAT_ID`."""
    forget = cmds.add_parser(
        "forget", parents=[as_json], help="delete everything stored for a chat (like /forget)"
    )
    forget.add_argument("chat_id", type=_chat_id, metavar="CHAT_ID")
    forget.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")


def _add_variants(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin variants`: the report, or with CHANGE a change to the experiment."""
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


def _add_assign(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin assign CHAT_ID VARIANT`."""
    assign = cmds.add_parser(
        "assign",
        parents=[as_json],
        help="move a chat to a variant of the experiment",
        description="Assign (or move) a chat to a variant of VARIANTS_FILE; its next reply "
        "comes from that variant. Recorded with source 'admin'.",
    )
    assign.add_argument("chat_id", type=_chat_id, metavar="CHAT_ID")
    assign.add_argument("variant", metavar="VARIANT")


def _add_audit(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin audit`: the recorded changes."""
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


def _add_sql(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin sql`: one read-only query."""
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


def _add_backup(cmds: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin backup PATH` and `admin restore PATH`."""
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


def _add_variant_changes(
    variants: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    """`admin variants add/weight/promote/remove/allocation/reload/list`."""
    changes = variants.add_subparsers(dest="variants_command", metavar="CHANGE")
    _add_variant_add(changes, as_json)
    _add_variant_weights(changes, as_json)
    _add_variant_listing(changes, as_json)
    _add_autopilot(changes, as_json)


def _add_variant_add(changes: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin variants add NAME --model PATH ...`."""
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


def _add_variant_weights(changes: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin variants weight/promote/remove/allocation`: who gets the new chats."""
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


def _add_variant_listing(changes: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin variants reload` and `admin variants list`."""
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


def _add_autopilot(changes: Any, as_json: argparse.ArgumentParser) -> None:
    """`admin variants autopilot {on,off,check}` and the policy's options."""
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


# `admin`'s subcommands in the order `admin --help` lists them.
_GROUPS: tuple[Callable[[Any, argparse.ArgumentParser], None], ...] = (
    _add_overview,
    _add_export,
    _add_forget,
    _add_variants,
    _add_assign,
    admin_access.add_parser,
    _add_audit,
    _add_sql,
    _add_backup,
)
