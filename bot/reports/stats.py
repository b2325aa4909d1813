"""The service's figures (conversations, messages, latency, queues): `/stats` in Telegram and
`python -m bot admin stats` both show them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.models import (
    Assignment,
    Counter,
    Inbox,
    InboxStatus,
    Message,
    Outbox,
    OutboxKind,
    Role,
    Session,
    SessionStatus,
    utcnow,
)
from bot.db.variants import current_identity
from bot.reports.chat_votes import chat_vote_table
from bot.reports.variant_stats import clustered_rate

DEFAULT_LATENCY_WINDOW = timedelta(hours=24)


# --- stats -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VariantStats:
    """One model variant at a glance (`python -m bot admin variants` has the full report)."""

    name: str
    chats: int  # assigned chats
    replies: int  # bot replies it produced
    votes_up: int
    votes_down: int
    # The same 👍 rate as `admin variants` (after the per-user cap, bot/reports/chat_votes.py
    # chat_votes): votes_up / (votes_up + votes_down) when no user has more than the cap.
    # None without votes.
    up_rate: float | None
    # Its 95% chat-level interval (None: no votes, or fewer than MIN_CHATS chats with votes)
    up_low: float | None = None
    up_high: float | None = None
    vote_chats: int = 0  # chats that voted on its replies


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
    # One entry per variant once any chat has an assignment (A/B experiments); else empty.
    variants: tuple[VariantStats, ...] = ()
    # The safety gate (bot/safety.py): replies by what it did, and personas it flagged.
    replies_flagged: int = 0  # sent, marked (SAFETY=flag)
    replies_replaced: int = 0  # a clean candidate beam sent instead (SAFETY=block)
    replies_deflected: int = 0  # the deflection sent instead (SAFETY=block)
    personas_flagged: int = 0
    # RETENTION_DAYS (bot/service/retention.py): the limit, and conversations deleted by it so far.
    retention_days: int | None = None
    retention_conversations: int = 0


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
            Message.role == Role.BOT,
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


async def _variant_stats(db: AsyncSession) -> tuple[VariantStats, ...]:
    chats: dict[str, int] = {
        name: n
        for name, n in await db.execute(
            select(Assignment.variant, func.count()).group_by(Assignment.variant)
        )
    }
    if not chats:
        return ()
    replies: dict[str, int] = {
        str(name): n
        for name, n in await db.execute(
            select(Message.variant, func.count())
            .where(
                Message.role == Role.BOT,
                Message.variant.is_not(None),
                current_identity(Message.variant_version),
            )
            .group_by(Message.variant)
        )
    }
    # The votes as the variants report reads them (one pair per chat, the per-user cap, the
    # current identity of each variant).
    votes = await chat_vote_table(db)
    result = []
    for name in sorted({*chats, *replies, *votes}, key=lambda n: (-chats.get(n, 0), n)):
        mine = votes.get(name, {}).values()
        rate = clustered_rate([v.pair for v in mine])
        result.append(
            VariantStats(
                name=str(name),
                chats=int(chats.get(name, 0)),
                replies=int(replies.get(name, 0)),
                votes_up=sum(v.up for v in mine),
                votes_down=sum(v.down for v in mine),
                up_rate=_none(rate.rate),
                up_low=_none(rate.low),
                up_high=_none(rate.high),
                vote_chats=rate.chats,
            )
        )
    return tuple(result)


def _none(value: float) -> float | None:
    return None if math.isnan(value) else value


async def stats(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    now: datetime | None = None,
    latency_window: timedelta = DEFAULT_LATENCY_WINDOW,
    retention_days: int | None = None,
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
                ).where(Outbox.kind == OutboxKind.REPLY, Outbox.sent_at.is_(None))
            )
        ).one()
        inbox = dict(
            (
                await db.execute(
                    select(Inbox.status, func.count())
                    .where(Inbox.status.in_((InboxStatus.PENDING, InboxStatus.FAILED)))
                    .group_by(Inbox.status)
                )
            ).all()
        )
        variants = await _variant_stats(db)
        safety = dict(
            (
                await db.execute(
                    select(Message.safety, func.count())
                    .where(Message.safety.is_not(None))
                    .group_by(Message.safety)
                )
            ).all()
        )
        personas_flagged = await db.scalar(
            select(func.count()).select_from(Session).where(Session.persona_safety.is_not(None))
        )
        retained = await db.scalar(
            select(Counter.value).where(Counter.name == "retention_conversations")
        )
    return Stats(
        chats=int(chats or 0),
        sessions_active=int(by_status.get(SessionStatus.ACTIVE, 0)),
        sessions_ended=int(by_status.get(SessionStatus.DONE, 0)),
        messages_today=int(messages_today or 0),
        messages_total=int(messages_total or 0),
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_samples=samples,
        latency_window_s=latency_window.total_seconds(),
        undelivered_replies=int(undelivered or 0),
        replies_given_up=int(given_up or 0),
        inbox_pending=int(inbox.get(InboxStatus.PENDING, 0)),
        inbox_failed=int(inbox.get(InboxStatus.FAILED, 0)),
        generated_at=now,
        variants=variants,
        replies_flagged=int(safety.get("flagged", 0)),
        replies_replaced=int(safety.get("replaced", 0)),
        replies_deflected=int(safety.get("deflected", 0)),
        personas_flagged=int(personas_flagged or 0),
        retention_days=retention_days,
        retention_conversations=int(retained or 0),
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
    unsafe = stats.replies_flagged + stats.replies_replaced + stats.replies_deflected
    if unsafe or stats.personas_flagged:
        lines.append(
            f"Safety: {unsafe} offensive replies ({stats.replies_replaced} replaced, "
            f"{stats.replies_deflected} deflected, {stats.replies_flagged} sent flagged), "
            f"{stats.personas_flagged} flagged personas"
        )
    if stats.retention_days or stats.retention_conversations:
        limit = f"{stats.retention_days} days" if stats.retention_days else "off"
        lines.append(
            f"Retention: {limit}; {stats.retention_conversations} conversations deleted so far"
        )
    lines += [format_variant_line(v) for v in stats.variants]
    return "\n".join(lines)


def format_variant_line(v: VariantStats) -> str:
    """`variant beam: 120 chats, 3,400 replies, 👍 71% (200 votes in 40 chats; 95% CI 64-77%)`:
    the rate and interval of `admin variants` (the chat as the unit)."""
    votes = v.votes_up + v.votes_down
    if v.up_rate is None:
        return f"variant {v.name}: {v.chats:,} chats, {v.replies:,} replies, 👍 n/a (no votes)"
    if v.up_low is None or v.up_high is None:
        interval = "too few for a CI"
    else:
        interval = f"95% CI {100 * v.up_low:.0f}-{100 * v.up_high:.0f}%"
    return (
        f"variant {v.name}: {v.chats:,} chats, {v.replies:,} replies, "
        f"👍 {100 * v.up_rate:.0f}% ({votes:,} votes in {v.vote_chats:,} chats; {interval})"
    )
