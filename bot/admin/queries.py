"""Admin queries: service health, conversations, exports, and read-only ad-hoc SQL.

Everything here reads the same tables the service writes (bot/db/models.py). The only write is
`forget_chat`, which goes through SessionStore so that it deletes exactly what /forget deletes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.db.models import Inbox, Message, Outbox, Session, utcnow
from bot.sessions import SessionStore

__all__ = [
    "EXPORT_COLUMNS",
    "AdminError",
    "ChatFootprint",
    "ExportRow",
    "SessionSummary",
    "SqlRefused",
    "SqlResult",
    "Stats",
    "Transcript",
    "TranscriptMessage",
    "chat_footprint",
    "chat_transcripts",
    "export_rows",
    "forget_chat",
    "format_stats",
    "list_sessions",
    "readonly_sql",
    "sqlite_path",
    "stats",
]

DEFAULT_LATENCY_WINDOW = timedelta(hours=24)


class AdminError(Exception):
    """An admin command cannot do what was asked; the message says why."""


class SqlRefused(AdminError):
    """`admin sql` refused a statement (a write, or more than one statement)."""


# --- stats -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    """Service health at a glance; the answer to `/stats` and `admin stats`."""

    chats: int
    sessions_active: int
    sessions_ended: int
    messages_today: int
    messages_total: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_samples: int
    latency_window_s: float
    undelivered_replies: int
    replies_given_up: int
    inbox_pending: int
    inbox_failed: int
    generated_at: datetime


def _start_of_day(now: datetime) -> datetime:
    utc = now.astimezone(UTC)
    return utc.replace(hour=0, minute=0, second=0, microsecond=0)


async def _latency_percentiles(
    db: AsyncSession, since: datetime
) -> tuple[float | None, float | None, int]:
    # Nearest-rank percentiles with window functions: PostgreSQL has percentile_cont but
    # SQLite has none, and this is the same portable form the README teaches.
    ranked = (
        select(
            Message.latency_ms.label("v"),
            func.row_number().over(order_by=Message.latency_ms).label("rn"),
            func.count().over().label("n"),
        )
        .where(
            Message.role == "bot",
            Message.latency_ms.is_not(None),
            Message.created_at >= since,
        )
        .subquery()
    )
    row = (
        await db.execute(
            select(
                func.min(case((ranked.c.rn * 100 >= ranked.c.n * 50, ranked.c.v))),
                func.min(case((ranked.c.rn * 100 >= ranked.c.n * 95, ranked.c.v))),
                func.count(),
            )
        )
    ).one()
    p50, p95, n = row
    return (
        None if p50 is None else float(p50),
        None if p95 is None else float(p95),
        int(n or 0),
    )


async def stats(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    now: datetime | None = None,
    latency_window: timedelta = DEFAULT_LATENCY_WINDOW,
) -> Stats:
    """Count chats, sessions, messages, latency and delivery problems (days are UTC days)."""
    now = now or utcnow()
    today = _start_of_day(now)
    async with sessionmaker() as db:
        chats = await db.scalar(select(func.count(func.distinct(Session.chat_id))))
        by_status = dict(
            (await db.execute(select(Session.status, func.count()).group_by(Session.status))).all()
        )
        messages_total = await db.scalar(select(func.count()).select_from(Message))
        messages_today = await db.scalar(
            select(func.count()).select_from(Message).where(Message.created_at >= today)
        )
        p50, p95, samples = await _latency_percentiles(db, now - latency_window)
        undelivered, given_up = (
            await db.execute(
                select(
                    func.count(),
                    func.count(Outbox.failed_at),
                ).where(Outbox.kind == "reply", Outbox.sent_at.is_(None))
            )
        ).one()
        inbox = dict(
            (
                await db.execute(
                    select(Inbox.status, func.count())
                    .where(Inbox.status.in_(("pending", "failed")))
                    .group_by(Inbox.status)
                )
            ).all()
        )
    return Stats(
        chats=int(chats or 0),
        sessions_active=int(by_status.get("active", 0)),
        sessions_ended=int(by_status.get("done", 0)),
        messages_today=int(messages_today or 0),
        messages_total=int(messages_total or 0),
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_samples=samples,
        latency_window_s=latency_window.total_seconds(),
        undelivered_replies=int(undelivered or 0),
        replies_given_up=int(given_up or 0),
        inbox_pending=int(inbox.get("pending", 0)),
        inbox_failed=int(inbox.get("failed", 0)),
        generated_at=now,
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def _window(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min"


def format_stats(stats: Stats) -> str:
    """Plain text for a terminal or a Telegram message (no markup, fits a phone screen)."""
    lines = [
        f"Bot stats at {stats.generated_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC",
        f"Chats: {stats.chats}",
        f"Sessions: {stats.sessions_active} active, {stats.sessions_ended} ended",
        f"Messages: {stats.messages_today} today (UTC), {stats.messages_total} in total",
        f"Reply latency ({_window(stats.latency_window_s)}, {stats.latency_samples} replies): "
        f"p50 {_ms(stats.latency_p50_ms)}, p95 {_ms(stats.latency_p95_ms)}",
        f"Undelivered replies: {stats.undelivered_replies}"
        + (f" ({stats.replies_given_up} given up)" if stats.replies_given_up else ""),
        f"Inbox: {stats.inbox_pending} pending, {stats.inbox_failed} failed",
    ]
    return "\n".join(lines)


# --- sessions and transcripts ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One conversation with its message count."""

    id: int
    chat_id: int
    user_id: int | None
    status: str
    persona: str
    messages: int
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


def _summaries_stmt() -> Any:
    counts = (
        select(Message.session_id, func.count().label("n")).group_by(Message.session_id).subquery()
    )
    return select(
        Session.id,
        Session.chat_id,
        Session.user_id,
        Session.status,
        Session.persona,
        func.coalesce(counts.c.n, 0),
        Session.created_at,
        Session.updated_at,
        Session.ended_at,
    ).outerjoin(counts, counts.c.session_id == Session.id)


async def list_sessions(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    active_only: bool = False,
    limit: int = 20,
) -> list[SessionSummary]:
    """Conversations, most recently active first."""
    stmt = _summaries_stmt()
    if active_only:
        stmt = stmt.where(Session.status == "active")
    stmt = stmt.order_by(Session.updated_at.desc(), Session.id.desc()).limit(limit)
    async with sessionmaker() as db:
        rows = (await db.execute(stmt)).all()
    return [SessionSummary(*r) for r in rows]


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    """One utterance as an admin reads it."""

    id: int
    role: str
    text: str
    created_at: datetime
    delivered_at: datetime | None
    latency_ms: float | None


@dataclass(frozen=True, slots=True)
class Transcript:
    """A conversation: its session (with persona) and every message, oldest first."""

    session: SessionSummary
    messages: list[TranscriptMessage] = field(default_factory=list)


async def chat_transcripts(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> list[Transcript]:
    """Every conversation of a chat, past ones first and the current one last."""
    async with sessionmaker() as db:
        sessions = (
            await db.execute(
                _summaries_stmt().where(Session.chat_id == chat_id).order_by(Session.id)
            )
        ).all()
        messages = (
            await db.execute(
                select(
                    Message.session_id,
                    Message.id,
                    Message.role,
                    Message.text,
                    Message.created_at,
                    Message.delivered_at,
                    Message.latency_ms,
                )
                .where(Message.chat_id == chat_id)
                .order_by(Message.id)
            )
        ).all()
    transcripts = {row[0]: Transcript(SessionSummary(*row)) for row in sessions}
    for m in messages:
        if m.session_id in transcripts:
            transcripts[m.session_id].messages.append(
                TranscriptMessage(m.id, m.role, m.text, m.created_at, m.delivered_at, m.latency_ms)
            )
    return list(transcripts.values())


# --- export ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportRow:
    """One message with the conversation it belongs to, flat for JSONL or CSV."""

    chat_id: int
    session_id: int
    user_id: int | None
    persona: str
    session_status: str
    message_id: int
    role: str
    text: str
    created_at: datetime
    delivered_at: datetime | None
    latency_ms: float | None


EXPORT_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ExportRow))


async def export_rows(engine: AsyncEngine, chat_id: int | None = None) -> AsyncIterator[ExportRow]:
    """Every message (of one chat, or all chats) in conversation order, streamed."""
    stmt = select(
        Message.chat_id,
        Message.session_id,
        Session.user_id,
        Session.persona,
        Session.status,
        Message.id,
        Message.role,
        Message.text,
        Message.created_at,
        Message.delivered_at,
        Message.latency_ms,
    ).join(Session, Session.id == Message.session_id)
    if chat_id is not None:
        stmt = stmt.where(Message.chat_id == chat_id)
    stmt = stmt.order_by(Message.chat_id, Message.session_id, Message.id)
    # Streamed, so that exporting a large database does not load it into memory.
    async with engine.connect() as conn:
        result = await conn.stream(stmt.execution_options(yield_per=500))
        async for row in result:
            yield ExportRow(*row)


# --- forget ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatFootprint:
    """How many rows of each table mention a chat."""

    sessions: int
    messages: int
    outbox: int
    inbox: int

    @property
    def total(self) -> int:
        """All rows together."""
        return self.sessions + self.messages + self.outbox + self.inbox


async def chat_footprint(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> ChatFootprint:
    """Count the rows that mention a chat (what `forget` would delete)."""
    async with sessionmaker() as db:
        counts = []
        for model in (Session, Message, Outbox, Inbox):
            n = await db.scalar(
                select(func.count()).select_from(model).where(model.chat_id == chat_id)
            )
            counts.append(int(n or 0))
    return ChatFootprint(*counts)


async def forget_chat(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> ChatFootprint:
    """Delete everything stored for a chat, as /forget does; returns what was there."""
    before = await chat_footprint(sessionmaker, chat_id)
    await SessionStore(sessionmaker).forget_chat(chat_id)
    return before


# --- read-only SQL -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows of an ad-hoc query."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def sqlite_path(url: str) -> Path:
    """The database file of an SQLite URL; AdminError if it is in memory or missing."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise AdminError(f"cannot inspect SQLite database {database or ':memory:'!r}")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise AdminError(
            f"no database at {path}: check DATABASE_URL / DATA_DIR, "
            "or create it with `python -m bot db upgrade`"
        )
    return path


READ_ONLY_MESSAGE = "refused: admin sql is read-only, use it for SELECT queries ({reason})"
ONE_STATEMENT_MESSAGE = "refused: admin sql runs exactly one statement ({reason})"


def _sqlite_readonly(path: Path, sql: str, max_rows: int, timeout_s: float) -> SqlResult:
    # mode=ro makes SQLite itself refuse every write; no ATTACH either, because attaching
    # creates the named file even on a read-only connection.
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout_s)
    except sqlite3.Error as err:
        raise AdminError(f"cannot open {path} read-only: {err}") from err
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        deadline = time.monotonic() + timeout_s
        # A runaway query is interrupted, like statement_timeout on PostgreSQL.
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = conn.execute(sql)
            rows = cur.fetchmany(max_rows + 1)
        except sqlite3.ProgrammingError as err:
            if "one statement" in str(err):
                raise SqlRefused(ONE_STATEMENT_MESSAGE.format(reason=err)) from err
            raise AdminError(f"SQL failed: {err}") from err
        except sqlite3.OperationalError as err:
            text = str(err)
            if "readonly" in text or "read-only" in text or "attached databases" in text:
                raise SqlRefused(READ_ONLY_MESSAGE.format(reason=text)) from err
            if text == "interrupted":
                raise AdminError(f"SQL took longer than {timeout_s:g} s and was stopped") from err
            raise AdminError(f"SQL failed: {text}") from err
        except sqlite3.Error as err:
            raise AdminError(f"SQL failed: {err}") from err
        columns = [d[0] for d in cur.description or ()]
        return SqlResult(columns, [tuple(r) for r in rows[:max_rows]], len(rows) > max_rows)
    finally:
        conn.rollback()
        conn.close()


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _postgres_readonly(url: str, sql: str, max_rows: int, timeout_s: float) -> SqlResult:
    import asyncpg

    try:
        conn = await asyncpg.connect(
            _asyncpg_dsn(url),
            timeout=min(timeout_s, 30),
            # Every transaction of this session is read-only, not just the one opened below.
            server_settings={
                "default_transaction_read_only": "on",
                "statement_timeout": str(int(timeout_s * 1000)),
                # CURRENT_DATE and printed timestamps in UTC, as on SQLite.
                "TimeZone": "UTC",
            },
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as err:
        raise AdminError(f"cannot connect to PostgreSQL: {err}") from err
    try:
        async with conn.transaction(readonly=True):
            # A prepared statement holds exactly one command; the server refuses more.
            stmt = await conn.prepare(sql)
            columns = [a.name for a in stmt.get_attributes()]
            rows: list[tuple[Any, ...]] = []
            if columns:
                async for record in stmt.cursor():
                    rows.append(tuple(record))
                    if len(rows) > max_rows:
                        break
            else:
                await stmt.fetch()
    except asyncpg.ReadOnlySQLTransactionError as err:
        raise SqlRefused(READ_ONLY_MESSAGE.format(reason=err)) from err
    except asyncpg.PostgresSyntaxError as err:
        if "multiple commands" in str(err):
            raise SqlRefused(ONE_STATEMENT_MESSAGE.format(reason=err)) from err
        raise AdminError(f"SQL failed: {err}") from err
    except asyncpg.QueryCanceledError as err:
        raise AdminError(f"SQL took longer than {timeout_s:g} s and was stopped") from err
    except asyncpg.PostgresError as err:
        raise AdminError(f"SQL failed: {err}") from err
    finally:
        await conn.close()
    return SqlResult(columns, rows[:max_rows], len(rows) > max_rows)


async def readonly_sql(
    url: str, sql: str, *, max_rows: int = 1000, timeout_s: float = 60.0
) -> SqlResult:
    """Run one statement on a connection the database itself keeps read-only.

    SQLite opens the file with mode=ro; PostgreSQL runs it in a READ ONLY transaction of a
    session whose default is read-only too (and whose time zone is UTC). Nothing parses the
    SQL: the databases refuse writes, and single-statement execution (sqlite3's execute, a
    PostgreSQL prepared statement) refuses a second statement.
    """
    if not sql.strip():
        raise AdminError("no SQL given")
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(url)
        return await asyncio.to_thread(_sqlite_readonly, path, sql, max_rows, timeout_s)
    if backend == "postgresql":
        return await _postgres_readonly(url, sql, max_rows, timeout_s)
    raise AdminError(f"admin sql does not support {backend} databases")
