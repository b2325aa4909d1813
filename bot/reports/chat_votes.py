"""Every 👍 vote the reports count, one chat at a time: `chat_vote_table` reads each chat's
votes on each variant's replies in one grouped query, with the per-user cap (USER_VOTE_CAP),
and `chat_votes` gives the (up, votes) pairs the chat-level statistics
(bot/reports/variant_stats.py) take. The variants report, /stats, the autopilot and the
benchmarks read votes through here, so they count them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.models import Assignment, Vote
from bot.db.variants import current_identity
from bot.reports.variant_stats import USER_VOTE_CAP


@dataclass(frozen=True, slots=True)
class ChatVotes:
    """One chat's votes on one variant's replies: raw counts, and after the per-user cap."""

    up: int  # 👍 as cast
    down: int  # 👎 as cast
    capped_up: float  # 👍 after the per-user cap (USER_VOTE_CAP)
    capped_votes: float  # all its votes after the cap

    @property
    def pair(self) -> tuple[float, float]:
        """The (up, votes) pair the chat-level statistics take."""
        return (self.capped_up, self.capped_votes)


async def chat_vote_table(
    db: AsyncSession,
    experiment: str | None = None,
    *,
    until: datetime | None = None,
    cap: float = USER_VOTE_CAP,
    identity: str | None = None,
) -> dict[str, dict[int, ChatVotes]]:
    """variant -> chat -> its votes on that variant's replies: every vote the report counts
    goes through here (one grouped query).

    The per-user cap: a user with m votes on a variant's replies (all chats together) has
    each of them weighted min(1, cap / m), so no user counts for more than `cap` votes of a
    variant. With `experiment`, only chats assigned in that experiment; `until`: only votes
    cast (created) at or before it, the figures as they stood then. Only votes on replies of
    each variant's current identity count (bot.db.variants.current_identity, in `identity`'s
    experiment, else in `experiment`'s): a name added again, or given another model, starts
    from nothing.
    """
    if not cap > 0:
        raise ValueError(f"the per-user cap must be > 0, got {cap}")
    is_up = case((Vote.value == 1, 1), else_=0)
    stmt = (
        select(Vote.variant, Vote.chat_id, Vote.user_id, func.sum(is_up), func.count())
        .where(
            Vote.variant.is_not(None),
            current_identity(Vote.variant_version, identity or experiment),
        )
        .group_by(Vote.variant, Vote.chat_id, Vote.user_id)
    )
    if experiment is not None:
        assigned = select(Assignment.chat_id).where(Assignment.experiment == experiment)
        stmt = stmt.where(Vote.chat_id.in_(assigned))
    if until is not None:
        stmt = stmt.where(Vote.created_at <= until)
    rows = [
        (str(variant), int(chat), int(user), int(up or 0), int(n or 0))
        for variant, chat, user, up, n in await db.execute(stmt)
    ]
    per_user: dict[tuple[str, int], int] = {}
    for variant, _, user, _, n in rows:
        per_user[(variant, user)] = per_user.get((variant, user), 0) + n
    out: dict[str, dict[int, ChatVotes]] = {}
    for variant, chat, user, up, n in rows:
        w = min(1.0, cap / per_user[(variant, user)])
        chats = out.setdefault(variant, {})
        old = chats.get(chat, ChatVotes(0, 0, 0.0, 0.0))
        chats[chat] = ChatVotes(
            old.up + up, old.down + n - up, old.capped_up + w * up, old.capped_votes + w * n
        )
    return out


async def chat_votes(
    db: AsyncSession, experiment: str | None = None, *, until: datetime | None = None
) -> dict[str, list[tuple[float, float]]]:
    """variant name -> one (up votes, all votes) pair per chat that voted on its replies,
    with the per-user cap (USER_VOTE_CAP) applied: what `always_valid_lift` and
    `chat_lift_test` take. The report reads the same table with `experiment=None` (every
    vote); see `chat_vote_table` for `experiment` and `until`."""
    table = await chat_vote_table(db, experiment, until=until)
    return {variant: [v.pair for v in chats.values()] for variant, chats in table.items()}
