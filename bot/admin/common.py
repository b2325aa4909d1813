"""What the `admin` subcommands share: their output (plain-text tables for a terminal, JSON
with `--json`), the usage error, and the settings a parsed command carries.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.exc import DBAPIError

from bot.config import Settings, get_settings
from bot.reports.admin import AdminError

MAX_CELL = 60


class UsageError(AdminError):
    """The command line asks for something impossible (exit status 2, like argparse)."""


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings `run_admin` put on the parsed arguments, else the process's own."""
    settings = getattr(args, "settings", None)
    return settings if isinstance(settings, Settings) else get_settings()


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


def when(value: datetime | None) -> str:
    """A timestamp as the tables show it: UTC, to the second; "" for none."""
    if value is None:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return f"{value:%Y-%m-%d %H:%M:%S}"


def _cell(value: Any, max_width: int = MAX_CELL) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return when(value)
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


def indent(text: str, prefix: str) -> str:
    """`text` with every line after the first led by `prefix`."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(prefix + line for line in rest)])


def hint(err: DBAPIError) -> str:
    """A database error's message, with the likely fix where the schema is missing."""
    text = str(err.orig) if err.orig is not None else str(err)
    if "no such table" in text or "does not exist" in text:
        return f"{text} (is the schema there? run `python -m bot db upgrade`)"
    return text
