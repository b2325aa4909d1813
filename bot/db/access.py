"""Access rules, refusals, per-user quotas and the shared reply counters (migration 0015).

Every replica reads and writes these rows, so what one replica decides the others follow:
an `admin access allow` within the readers' cache time (bot/service/access.py), a refusal's
quiet hour, a quota's count.

The counters are fixed windows (a UTC day, a UTC minute) keyed by (user, span, start), raised
with one INSERT ... ON CONFLICT DO UPDATE ... RETURNING (SQLite 3.35+ and PostgreSQL spell it
alike through SQLAlchemy's dialect inserts, as bot/db/dialect.py does): the database does the
increment, so two replicas never both take the last reply. Fixed windows, not sliding ones,
because the user can then be told exactly when the next reply is theirs (the window's end).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Integer, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db.dialect import db_now, dialect_insert
from bot.db.models import AccessRefusal, AccessRule, QuotaCounter, UserQuota, utcnow

ALLOW = "allow"
DENY = "deny"
SPANS = {"day": timedelta(days=1), "minute": timedelta(minutes=1)}


async def rules(db: AsyncSession) -> dict[str, str]:
    """Every rule: subject ("user:<id>", "chat:<id>", "@name") -> "allow" | "deny"."""
    rows = await db.execute(select(AccessRule.subject, AccessRule.rule))
    return {subject: rule for subject, rule in rows.all()}


async def set_rule(db: AsyncSession, subject: str, rule: str) -> None:
    """Allow or deny `subject` (replacing any rule it had)."""
    await db.execute(delete(AccessRule).where(AccessRule.subject == subject))
    db.add(AccessRule(subject=subject, rule=rule))
    await db.flush()


async def remove_rule(db: AsyncSession, subject: str) -> bool:
    """Remove `subject`'s rule; False if it had none."""
    result = await db.execute(delete(AccessRule).where(AccessRule.subject == subject))
    return bool(getattr(result, "rowcount", 0))


async def claim_refusal(db: AsyncSession, chat_id: int, quiet_s: float) -> bool:
    """True if the chat is due a refusal (none in the last `quiet_s` seconds), recording it;
    one atomic upsert, so of two replicas refusing the same chat at once only one says so."""
    now = db_now(db)
    ins = dialect_insert(db, AccessRefusal).values(chat_id=chat_id, refused_at=now)
    result = await db.execute(
        ins.on_conflict_do_update(
            index_elements=["chat_id"],
            set_={"refused_at": now},
            where=AccessRefusal.refused_at < db_now(db, -quiet_s),
        )
    )
    return bool(getattr(result, "rowcount", 0))


async def set_quota(
    db: AsyncSession, user_id: int, per_day: int | None, per_minute: int | None
) -> None:
    """Give the user their own limits (None: no limit for that window)."""
    await db.execute(delete(UserQuota).where(UserQuota.user_id == user_id))
    db.add(UserQuota(user_id=user_id, per_day=per_day, per_minute=per_minute))
    await db.flush()


async def clear_quota(db: AsyncSession, user_id: int) -> bool:
    """Back to the global limits; False if the user had none of their own."""
    result = await db.execute(delete(UserQuota).where(UserQuota.user_id == user_id))
    return bool(getattr(result, "rowcount", 0))


async def all_quotas(db: AsyncSession) -> list[UserQuota]:
    """Every user's own limits, by user id."""
    return list((await db.scalars(select(UserQuota).order_by(UserQuota.user_id))).all())


def window_start(span: str, now: datetime) -> datetime:
    """The start of the fixed window of `span` ("day": UTC midnight; "minute") holding `now`."""
    if span == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class Over:
    """A reply refused by a quota: the window that is full, its limit, when it ends, and
    whether this is the first refusal in it (the one the user is told about)."""

    span: str
    limit: int
    until: datetime
    first: bool


class _Full(Exception):
    """Raised inside the counting transaction to roll it back."""


async def _bump(db: AsyncSession, user_id: int, span: str, start: datetime, column: str) -> int:
    ins = dialect_insert(db, QuotaCounter).values(
        user_id=user_id, span=span, start=start, **{column: 1}
    )
    col = QuotaCounter.__table__.c[column]
    result = await db.execute(
        ins.on_conflict_do_update(
            index_elements=["user_id", "span", "start"], set_={column: col + 1}
        ).returning(col.cast(Integer))
    )
    value = int(result.scalar_one())
    if value == 1 and column == "replies":  # a new window: the user's older ones are done
        await db.execute(
            delete(QuotaCounter).where(
                QuotaCounter.user_id == user_id,
                QuotaCounter.span == span,
                QuotaCounter.start < start,
            )
        )
    return value


async def take_reply(
    sessionmaker: async_sessionmaker[AsyncSession],
    user_id: int,
    limits: dict[str, int | None],
    now: datetime | None = None,
) -> Over | None:
    """Count one reply for the user in every window with a limit; None if it fits them all.

    All windows are raised in one transaction; if any goes over its limit the transaction is
    rolled back (nothing counted: a refused message is no reply) and the refusal is counted
    instead, in a transaction of its own. PostgreSQL's row lock on the upserted counter keeps
    concurrent replicas in line; SQLite has one writer at a time anyway.
    """
    now = now or utcnow()
    spans = [(span, limit) for span, limit in limits.items() if limit is not None]
    if not spans:
        return None
    over: list[tuple[str, int, datetime]] = []
    try:
        async with sessionmaker.begin() as db:
            for span, limit in spans:
                start = window_start(span, now)
                if await _bump(db, user_id, span, start, "replies") > limit:
                    over.append((span, limit, start))
            if over:
                raise _Full  # rolls the increments back
    except _Full:
        pass
    if not over:
        return None
    async with sessionmaker.begin() as db:
        first = False
        for span, _limit, start in over:
            first = await _bump(db, user_id, span, start, "refused") == 1 or first
    # The window that ends last is the one the user waits for.
    span, limit, start = max(over, key=lambda o: o[2] + SPANS[o[0]])
    return Over(span=span, limit=limit, until=start + SPANS[span], first=first)
