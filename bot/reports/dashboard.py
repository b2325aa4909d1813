"""What the dashboard's pages read, beyond bot.reports.stats and bot.reports.variants (which it
reuses).

Every function takes an AsyncSession of the read-only engine (bot.admin.sql.readonly_engine)
and runs a fixed number of indexed queries, whatever the page size: no query per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Date,
    Integer,
    and_,
    case,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.models import (
    Assignment,
    ChatLease,
    Message,
    Outbox,
    Rating,
    Role,
    Session,
    Vote,
)
from bot.db.replicas import all_replicas
from bot.reports.rows import MESSAGE_COLUMNS, TranscriptMessage

# A replica whose heartbeat (written every second) is older than this is dead (the default of
# TAKEOVER_AFTER_S, which the dashboard passes).
REPLICA_ALIVE_S = 5.0
PAGE_SIZE = 50
TRANSCRIPT_LIMIT = 1000


# --- overview ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DayPoint:
    """One UTC day of the overview's charts."""

    day: date
    messages: int
    latency_samples: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None


def _day(col: Any, dialect: str) -> ColumnElement[Any]:
    """The UTC day of a timestamp column (SQLite stores UTC text: its first ten characters)."""
    if dialect == "postgresql":
        return cast(func.timezone("UTC", col), Date)
    return func.substr(col, 1, 10)


def _bucket(col: Any, dialect: str) -> ColumnElement[Any]:
    """Latency to the millisecond below a second, to 10 ms above (percentiles from counts)."""

    def floor(x: Any) -> ColumnElement[Any]:
        return func.floor(x) if dialect == "postgresql" else cast(x, Integer)

    return case((col < 1000, floor(col)), else_=floor(col / 10) * 10)


def _key(day: Any) -> str:
    return day.isoformat() if isinstance(day, date) else str(day)


def nearest_rank(buckets: list[tuple[float, int]], pct: float) -> float | None:
    """The nearest-rank percentile of a histogram of (value, count) pairs, as
    bot.reports.stats ranks."""
    total = sum(n for _, n in buckets)
    seen = 0
    for value, n in sorted(buckets):
        seen += n
        if seen * 100 >= total * pct:
            return value
    return None


def first_day(now: datetime, days: int) -> date:
    """The first UTC day of the last `days` days up to `now`'s."""
    return (now.astimezone(UTC) - timedelta(days=days - 1)).date()


async def daily_series(db: AsyncSession, *, first: date, days: int) -> list[DayPoint]:
    """Messages per UTC day and the bot replies' latency p50/p95 per day: `days` days from
    `first`.

    The counts are one range count per day on ix_messages_created_at, in one statement (a
    GROUP BY on the day would sort every message of the period). The percentiles are
    nearest-rank like bot.reports.stats', from per-day counts of each millisecond (10 ms above a
    second) read from ix_messages_created_at_role_latency, which holds the latency too, instead of
    ranking every reply of the period.
    """
    if days < 1:
        return []
    dialect = db.get_bind().dialect.name
    since = datetime(first.year, first.month, first.day, tzinfo=UTC)
    bounds = [since + timedelta(days=i) for i in range(days + 1)]
    per_day = [
        select(func.count())
        .select_from(Message)
        .where(Message.created_at >= bounds[i], Message.created_at < bounds[i + 1])
        .scalar_subquery()
        for i in range(days)
    ]
    row = (await db.execute(select(*per_day))).one()
    counts = {(first + timedelta(days=i)).isoformat(): int(n or 0) for i, n in enumerate(row)}
    day = _day(Message.created_at, dialect).label("day")
    bucket = _bucket(Message.latency_ms, dialect).label("bucket")
    histograms: dict[str, list[tuple[float, int]]] = {}
    for d, value, n in await db.execute(
        select(day, bucket, func.count())
        .where(
            Message.role == Role.BOT,
            Message.created_at >= since,
            Message.created_at < bounds[-1],
            Message.latency_ms.is_not(None),
        )
        .group_by(day, bucket)
    ):
        histograms.setdefault(_key(d), []).append((float(value), int(n)))
    points = []
    for i in range(days):
        d = first + timedelta(days=i)
        hist = histograms.get(d.isoformat(), [])
        points.append(
            DayPoint(
                d,
                counts.get(d.isoformat(), 0),
                sum(n for _, n in hist),
                nearest_rank(hist, 50),
                nearest_rank(hist, 95),
            )
        )
    return points


async def outbox_depth(db: AsyncSession) -> int:
    """Texts waiting to be sent (not sent, not given up), replies and notices alike."""
    n = await db.scalar(
        select(func.count())
        .select_from(Outbox)
        .where(Outbox.sent_at.is_(None), Outbox.failed_at.is_(None))
    )
    return int(n or 0)


# --- conversations -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationFilter:
    """The search form of the conversations page; empty fields do not filter."""

    chat_id: int | None = None
    persona: str = ""
    on: date | None = None  # conversations active on this UTC day
    # keyset pagination: rows strictly older than (updated_at, id)
    before: tuple[datetime, int] | None = None


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """One line of the conversations list."""

    id: int
    chat_id: int
    user_id: int | None
    status: str
    persona: str
    variant: str | None
    messages: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ConversationPage:
    """A page of conversations, most recently active first, and where the next page starts."""

    rows: list[ConversationRow]
    next_before: tuple[datetime, int] | None


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def conversations(
    db: AsyncSession, where: ConversationFilter, *, limit: int = PAGE_SIZE
) -> ConversationPage:
    """Sessions matching the filter, newest activity first; two queries per page."""
    stmt = select(
        Session.id,
        Session.chat_id,
        Session.user_id,
        Session.status,
        Session.persona,
        Assignment.variant,
        Session.created_at,
        Session.updated_at,
    ).outerjoin(Assignment, Assignment.chat_id == Session.chat_id)
    if where.chat_id is not None:
        stmt = stmt.where(Session.chat_id == where.chat_id)
    if where.persona:
        # Case-insensitive on both backends (SQLite's LIKE is, for ASCII).
        stmt = stmt.where(
            func.lower(Session.persona).like(_like_pattern(where.persona.lower()), escape="\\")
        )
    if where.on is not None:
        start = datetime(where.on.year, where.on.month, where.on.day, tzinfo=UTC)
        stmt = stmt.where(
            Session.created_at < start + timedelta(days=1), Session.updated_at >= start
        )
    if where.before is not None:
        at, sid = where.before
        stmt = stmt.where(
            or_(Session.updated_at < at, and_(Session.updated_at == at, Session.id < sid))
        )
    stmt = stmt.order_by(Session.updated_at.desc(), Session.id.desc()).limit(limit + 1)
    found = (await db.execute(stmt)).all()
    page = found[:limit]
    counts: dict[int, int] = {}
    if page:
        counts = {
            int(sid): int(n)
            for sid, n in await db.execute(
                select(Message.session_id, func.count())
                .where(Message.session_id.in_([r.id for r in page]))
                .group_by(Message.session_id)
            )
        }
    rows = [
        ConversationRow(
            id=r.id,
            chat_id=r.chat_id,
            user_id=r.user_id,
            status=r.status,
            persona=r.persona,
            variant=r.variant,
            messages=counts.get(r.id, 0),
            created_at=r.created_at,
            updated_at=r.updated_at,
        )
        for r in page
    ]
    more = len(found) > limit
    return ConversationPage(rows, (page[-1].updated_at, page[-1].id) if more else None)


@dataclass(frozen=True, slots=True)
class TranscriptLine(TranscriptMessage):
    """One message of a transcript (the admin reports' row), with its delivery state and
    votes."""

    model_ms: float | None
    variant: str | None
    safety: str | None
    votes_up: int
    votes_down: int
    # bot replies: "delivered", "sending" (attempts so far), "given up", or "" (user messages)
    delivery: str
    attempts: int
    last_error: str | None
    # Bot replies: the model read another persona (`reply_persona`) than for the reply before
    # (none before the first): the page shows it above the reply.
    persona_changed: bool = False


@dataclass(frozen=True, slots=True)
class TranscriptView:
    """A conversation: the session, its messages oldest first, its rating, the chat's others."""

    id: int
    chat_id: int
    user_id: int | None
    status: str
    persona: str
    persona_safety: str | None
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    variant: str | None
    rating: int | None
    lines: list[TranscriptLine] = field(default_factory=list)
    truncated: bool = False
    siblings: list[tuple[int, datetime, str]] = field(default_factory=list)  # id, created, status


def _delivery(delivered_at: datetime | None, sent_at: Any, failed_at: Any, role: str) -> str:
    if role != Role.BOT:
        return ""
    if delivered_at is not None or sent_at is not None:
        return "delivered"
    if failed_at is not None:
        return "given up"
    return "sending"


async def transcript(
    db: AsyncSession, session_id: int, *, limit: int = TRANSCRIPT_LIMIT
) -> TranscriptView | None:
    """One conversation with everything the transcript page shows; five queries."""
    s = (
        await db.execute(
            select(Session, Assignment.variant, Rating.value)
            .outerjoin(Assignment, Assignment.chat_id == Session.chat_id)
            .outerjoin(Rating, Rating.session_id == Session.id)
            .where(Session.id == session_id)
        )
    ).first()
    if s is None:
        return None
    session, variant, rating = s
    rows = await _transcript_rows(db, session_id, limit)
    lines = _transcript_lines(rows[:limit])
    siblings = [
        (int(i), created, str(status))
        for i, created, status in await db.execute(
            select(Session.id, Session.created_at, Session.status)
            .where(Session.chat_id == session.chat_id)
            .order_by(Session.id)
        )
    ]
    return TranscriptView(
        id=session.id,
        chat_id=session.chat_id,
        user_id=session.user_id,
        status=session.status,
        persona=session.persona,
        persona_safety=session.persona_safety,
        created_at=session.created_at,
        updated_at=session.updated_at,
        ended_at=session.ended_at,
        variant=variant,
        rating=rating,
        lines=lines,
        truncated=len(rows) > limit,
        siblings=siblings,
    )


async def _transcript_rows(db: AsyncSession, session_id: int, limit: int) -> Sequence[Any]:
    """The conversation's messages (at most `limit` + 1, to tell a cut one), each with its
    votes and its newest delivery."""
    votes = (
        select(
            Vote.message_id.label("mid"),
            func.sum(case((Vote.value == 1, 1), else_=0)).label("up"),
            func.sum(case((Vote.value == -1, 1), else_=0)).label("down"),
        )
        .where(Vote.message_id.in_(select(Message.id).where(Message.session_id == session_id)))
        .group_by(Vote.message_id)
        .subquery()
    )
    # A regenerated reply has one outbox row per version: the newest says the state.
    latest = (
        select(func.max(Outbox.id))
        .where(Outbox.message_id == Message.id, Outbox.kind == "reply")
        .correlate(Message)
        .scalar_subquery()
    )
    return (
        await db.execute(
            select(
                *MESSAGE_COLUMNS,
                Message.model_ms,
                Message.variant,
                Message.safety,
                func.coalesce(votes.c.up, 0),
                func.coalesce(votes.c.down, 0),
                Outbox.sent_at,
                Outbox.failed_at,
                func.coalesce(Outbox.attempts, 0),
                Outbox.last_error,
            )
            .outerjoin(votes, votes.c.mid == Message.id)
            .outerjoin(Outbox, Outbox.id == latest)
            .where(Message.session_id == session_id)
            .order_by(Message.id)
            .limit(limit + 1)
        )
    ).all()


def _transcript_lines(rows: Sequence[Any]) -> list[TranscriptLine]:
    """The transcript's lines; a reply whose persona differs from the one before is marked."""
    lines = []
    read = ""  # the persona the previous reply read; the first reply is compared with none
    for r in rows:
        persona = r[6]
        lines.append(
            TranscriptLine(
                # MESSAGE_COLUMNS, TranscriptMessage's fields
                *(r[0], r[1], r[2], r[3], r[4], r[5], persona),
                model_ms=r[7],
                variant=r[8],
                safety=r[9],
                votes_up=int(r[10]),
                votes_down=int(r[11]),
                delivery=_delivery(r[4], r[12], r[13], r[1]),
                attempts=int(r[14]),
                last_error=r[15],
                persona_changed=persona is not None and persona != read,
            )
        )
        if persona is not None:
            read = persona
    return lines


# --- health ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A model worker process of a replica, as its heartbeat reports it."""

    variant: str
    pid: int | None
    alive: bool
    restarts: int
    cached: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A service replica: its heartbeat row, parsed, and the leases it holds."""

    owner: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    alive: bool
    mode: str
    poller: bool
    ready: bool | None  # None: the replica does not report it
    problems: list[str]
    workers: list[WorkerInfo]
    leases: dict[str, int]  # kind -> leases held (unexpired)


@dataclass(frozen=True, slots=True)
class HealthPage:
    """The health page: replicas (None: the table is missing), and leases by owner."""

    replicas: list[ReplicaInfo] | None
    missing: str | None  # why the replicas are unknown
    # owner -> kind -> (held, expired): owners without a replica row too
    leases: dict[str, dict[str, tuple[int, int]]]

    @property
    def cache(self) -> tuple[int, int]:
        """Hits and misses of the clone caches of every live replica's workers."""
        hits = misses = 0
        for r in self.replicas or []:
            if r.alive:
                for w in r.workers:
                    hits += w.hits
                    misses += w.misses
        return hits, misses

    @property
    def cache_hit_rate(self) -> float | None:
        """hits / (hits + misses) over the live replicas; None without lookups."""
        hits, misses = self.cache
        return hits / (hits + misses) if hits + misses else None


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _workers(raw: Any) -> list[WorkerInfo]:
    out = []
    for w in raw if isinstance(raw, list) else []:
        if not isinstance(w, dict):
            continue
        raw_cache = w.get("cache")
        cache: dict[str, Any] = raw_cache if isinstance(raw_cache, dict) else {}
        pid = w.get("pid")
        out.append(
            WorkerInfo(
                variant=str(w.get("variant", "?")),
                pid=pid if isinstance(pid, int) else None,
                alive=bool(w.get("alive")),
                restarts=_int(w.get("restarts")),
                cached=_int(cache.get("cached")),
                hits=_int(cache.get("hits")),
                misses=_int(cache.get("misses")),
                evictions=_int(cache.get("evictions")),
            )
        )
    return out


async def health(
    db: AsyncSession, *, now: datetime, alive_s: float = REPLICA_ALIVE_S
) -> HealthPage:
    """Replicas with their heartbeat, readiness, workers and leases; two or three queries.

    A replica whose heartbeat is older than `alive_s` (TAKEOVER_AFTER_S, the age at which the
    other replicas take over its chats) is dead.
    """
    held = ChatLease.lease_until > now
    leases: dict[str, dict[str, tuple[int, int]]] = {}
    for owner, kind, n_held, n_expired in await db.execute(
        select(
            ChatLease.owner,
            ChatLease.kind,
            func.sum(case((held, 1), else_=0)),
            func.sum(case((held, 0), else_=1)),
        ).group_by(ChatLease.owner, ChatLease.kind)
    ):
        leases.setdefault(str(owner), {})[str(kind)] = (int(n_held or 0), int(n_expired or 0))
    try:
        rows = await all_replicas(db)
    except DBAPIError as err:
        text = str(err.orig) if err.orig is not None else str(err)
        if "no such table" in text or "does not exist" in text:  # not migrated to 0005 yet
            await db.rollback()
            return HealthPage(None, "no replicas table: run `python -m bot db upgrade`", leases)
        raise
    replicas = []
    for r in rows:
        info = r.info
        age = (now - r.heartbeat_at).total_seconds()
        problems = info.get("problems")
        replicas.append(
            ReplicaInfo(
                owner=r.owner,
                host=r.host,
                pid=r.pid,
                started_at=r.started_at,
                heartbeat_at=r.heartbeat_at,
                heartbeat_age_s=max(0.0, age),
                alive=age <= alive_s,
                mode=str(info.get("mode", "?")),
                poller=bool(info.get("poller")),
                ready=None if "ready" not in info else bool(info["ready"]),
                problems=[str(p) for p in problems] if isinstance(problems, list) else [],
                workers=_workers(info.get("workers")),
                leases={k: v[0] for k, v in leases.get(r.owner, {}).items()},
            )
        )
    return HealthPage(replicas, None, leases)


__all__ = [
    "PAGE_SIZE",
    "REPLICA_ALIVE_S",
    "ConversationFilter",
    "ConversationPage",
    "ConversationRow",
    "DayPoint",
    "HealthPage",
    "ReplicaInfo",
    "TranscriptLine",
    "TranscriptView",
    "WorkerInfo",
    "conversations",
    "daily_series",
    "first_day",
    "health",
    "outbox_depth",
    "transcript",
]
