"""Guard metrics per variant: what a candidate must not make worse while it wins 👍 votes.

Five figures per variant, read from its stored replies (the report and the autopilot read
the same function, so they see the same numbers):

- distinct share: distinct reply texts (compared casefolded, whitespace collapsed) among its
  most recent replies, at most WINDOW of them. The share falls as replies accumulate (common
  replies recur), so two variants are compared over the same number of replies: the autopilot
  reads both again with the smaller count (`window=`).
- repetition share: of those recent replies, the ones that repeat themselves: the same text as
  the variant's previous reply in the same conversation, or a word 3-gram that occurs twice
  within the reply ("i like dogs . i like dogs ."). A model collapsing onto a few replies, or
  looping inside one, shows here.
- safety share: replies the safety gate acted on (`messages.safety` set: flagged, replaced or
  deflected), of all its replies.
- failed share: failed turns of its chats (the chat was told "Sorry, I couldn't come up with a
  reply" or, after retries, "Sorry, something went wrong": an outbox notice with one of those
  sentences, in any shipped language), of its replies plus failed turns. A failed turn stores
  no reply and no variant, so it is the variant of the chat's assignment.
- latency p95: the 95th percentile of `messages.latency_ms` over all its replies, as the
  report's p95 column.

Read-only. Per variant name, counting the replies of its current identity only (with
`experiment`; bot.db.variants.current_identity), as the rest of the report: a name added
again, or given another model, starts from nothing here too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot import texts
from bot.db.models import Assignment, Message, Outbox, OutboxKind, Role
from bot.db.variants import current_identity
from bot.reports.variant_stats import latency_percentiles

WINDOW = 500  # the most recent replies the text guards read per variant
NGRAM = 3  # a word n-gram that occurs twice within a reply makes it repetitive

_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class GuardFigures:
    """One variant's guard metrics; shares are NaN where there is nothing to count."""

    replies: int  # all its replies
    window: int  # the recent replies the distinct and repetition shares read
    distinct_share: float
    repetition_share: float
    safety_flags: int  # replies with messages.safety set
    safety_share: float  # safety_flags / replies
    failed_turns: int
    failed_share: float  # failed_turns / (replies + failed_turns)
    latency_p95_ms: float


def normalized(text: str) -> str:
    """A reply as the distinct and repetition guards compare it."""
    return " ".join(text.casefold().split())


def distinct_share(replies: Sequence[str]) -> float:
    """Distinct texts (normalized) over replies; NaN for none."""
    if not replies:
        return math.nan
    return len({normalized(t) for t in replies}) / len(replies)


def repeats_itself(text: str, previous: str | None) -> bool:
    """The same text as the previous reply of the conversation, or a word NGRAM-gram twice."""
    if previous is not None and normalized(text) == normalized(previous):
        return True
    words = _WORD.findall(text.casefold())
    grams = [tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)]
    return len(set(grams)) < len(grams)


def failure_texts() -> list[str]:
    """What a chat is told when a turn failed: NO_REPLY (generation failed) and APOLOGY (the
    update failed every attempt), in every shipped language."""
    found: set[str] = set()
    for language in texts.LANGUAGES:
        catalog = texts.for_language(language)
        found.update((catalog.NO_REPLY, catalog.APOLOGY))
    return sorted(found)


async def _recent(
    db: AsyncSession, name: str, window: int, experiment: str | None
) -> list[tuple[str, str | None]]:
    """The variant's `window` most recent replies, newest first, each with its previous reply
    in the same conversation (None for a conversation's first)."""
    previous = func.lag(Message.text).over(partition_by=Message.session_id, order_by=Message.id)
    mine = (
        select(Message.id, Message.text, previous.label("previous"))
        .where(
            Message.role == Role.BOT,
            Message.variant == name,
            current_identity(Message.variant_version, experiment),
        )
        .subquery()
    )
    rows = await db.execute(
        select(mine.c.text, mine.c.previous).order_by(mine.c.id.desc()).limit(window)
    )
    return [(str(t), None if p is None else str(p)) for t, p in rows]


async def guard_figures(
    db: AsyncSession,
    names: Sequence[str],
    *,
    window: int = WINDOW,
    experiment: str | None = None,
) -> dict[str, GuardFigures]:
    """Each named variant's guard metrics (the text guards over its `window` most recent
    replies), from the replies of its current identity in `experiment` and, for failed turns,
    the chats assigned in it (None: any experiment)."""
    names = list(names)
    mine = (
        Message.role == Role.BOT,
        Message.variant.in_(names),
        current_identity(Message.variant_version, experiment),
    )
    in_experiment = () if experiment is None else (Assignment.experiment == experiment,)
    flagged = case((Message.safety.is_not(None), 1), else_=0)
    counts = {
        str(v): (int(n or 0), int(s or 0))
        for v, n, s in await db.execute(
            select(Message.variant, func.count(), func.sum(flagged))
            .where(*mine)
            .group_by(Message.variant)
        )
    }
    failed = {
        str(v): int(n or 0)
        for v, n in await db.execute(
            select(Assignment.variant, func.count())
            .join(Outbox, Outbox.chat_id == Assignment.chat_id)
            .where(
                Outbox.kind == OutboxKind.NOTICE,
                Outbox.text.in_(failure_texts()),
                Assignment.variant.in_(names),
                *in_experiment,
            )
            .group_by(Assignment.variant)
        )
    }
    latency: dict[str, list[float]] = {}
    for v, ms in await db.execute(
        select(Message.variant, Message.latency_ms).where(*mine, Message.latency_ms.is_not(None))
    ):
        if ms is not None:
            latency.setdefault(str(v), []).append(float(ms))
    out: dict[str, GuardFigures] = {}
    for name in names:
        replies, flags = counts.get(name, (0, 0))
        recent = await _recent(db, name, window, experiment) if window > 0 else []
        repeated = sum(1 for text, previous in recent if repeats_itself(text, previous))
        fails = failed.get(name, 0)
        out[name] = GuardFigures(
            replies=replies,
            window=len(recent),
            distinct_share=distinct_share([t for t, _ in recent]),
            repetition_share=repeated / len(recent) if recent else math.nan,
            safety_flags=flags,
            safety_share=flags / replies if replies else math.nan,
            failed_turns=fails,
            failed_share=fails / (replies + fails) if replies + fails else math.nan,
            latency_p95_ms=latency_percentiles(latency.get(name, []))[1],
        )
    return out
