"""The A/B report behind `python -m bot admin variants`: per-variant figures from the database,
each non-control variant against the control, and the sample-ratio-mismatch check.

Read-only: a handful of aggregate queries (and the latency columns of the bot replies, for
the percentiles), then pure arithmetic from bot.reports.variant_stats. The chat is the unit of
every 👍-rate figure: all votes are read through `chat_vote_table` (bot/reports/chat_votes.py:
one (up, votes) pair per chat and variant, with the per-user cap), and the intervals and tests
are chat-level (cluster-robust, and always-valid beside the fixed-horizon ones);
docs/variants.md says what each figure means for an operator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import autopilot as autopilot_rows
from bot.db.autopilot import StoredDecision
from bot.db.models import ArenaMatch, Assignment, AssignmentSource, Message, Rating, Role
from bot.db.variants import current_identity
from bot.engine.variants import Experiment
from bot.reports.bradley_terry import bradley_terry_bootstrap
from bot.reports.chat_votes import ChatVotes, chat_vote_table
from bot.reports.guards import guard_figures
from bot.reports.variant_stats import (
    ALWAYS_VALID_NOTE,
    BANDIT_NOTE,
    FIXED_SAMPLE_NOTE,
    SrmResult,
    always_valid_lift,
    chat_lift_test,
    clustered_rate,
    ipw_rate,
    latency_percentiles,
    rating_interval,
    sample_ratio_against,
    sample_ratio_mismatch,
)

NAN = math.nan
#: The report's note: which figures may be read at any time, and which only once.
REPORT_NOTE = f"{ALWAYS_VALID_NOTE} {FIXED_SAMPLE_NOTE}"


@dataclass(frozen=True, slots=True)
class VariantFigures:
    """One variant's figures. Rates, means and percentiles are NaN where there is no data."""

    name: str
    weight: float  # from the variants file; 0 for a variant it no longer has
    control: bool
    served: bool  # False: only the database knows it (the file no longer has it)
    chats: int  # assigned chats, from any source
    # Chats the weighted hash drew into it (what the SRM check counts), including those moved
    # off it since because it was removed (assignments.source moved); not fallback chats.
    chats_hash: int
    turns: int  # bot replies it produced
    votes_up: int  # as cast
    votes_down: int
    # The 👍 share of its votes after the per-user cap (USER_VOTE_CAP): sum of the chats'
    # capped 👍 over their capped votes; votes_up / votes when no user has more than the cap.
    up_rate: float
    # 95% chat-level interval of up_rate (cluster-robust, see variant_stats.clustered_rate);
    # NaN with fewer than MIN_CHATS chats with votes ("n/a (too few)")
    up_low: float
    up_high: float
    ratings: int
    rating_mean: float
    # 95% interval of the mean rating that stays within 1..5, chats as the unit
    # (variant_stats.rating_interval); NaN with fewer than MIN_CHATS rated chats
    rating_low: float
    rating_high: float
    latency_p50_ms: float  # messages.latency_ms of its replies
    latency_p95_ms: float
    model_p50_ms: float  # messages.model_ms of its replies
    reply_chars: float  # mean reply length in characters
    # Inverse-propensity estimates over its hash-assigned chats with a recorded probability
    # (assignments.probability): each chat's votes weighted by 1 / that probability.
    ipw_up_rate: float = NAN
    ipw_low: float = NAN
    ipw_high: float = NAN
    ipw_chats: int = 0
    ipw_effective_chats: float = 0.0
    # What the sample-ratio check expects: the sum of the recorded allocation probabilities
    # (and, for older rows without one, the weights' share).
    expected_chats: float = NAN
    vote_chats: int = 0  # chats that voted on its replies (the unit of the 👍 figures)
    votes_counted: float = 0.0  # its votes after the per-user cap
    # How many independent votes the chat-level interval is worth (<= votes_counted)
    up_effective_votes: float = NAN
    # Guard metrics (bot.reports.guards, what the autopilot judges): distinct and repetitive
    # shares over its `guard_window` most recent replies, the safety gate's share of all its
    # replies, and failed turns of its chats (share of replies + failed turns).
    distinct_share: float = NAN
    repetition_share: float = NAN
    safety_share: float = NAN
    failed_turns: int = 0
    failed_share: float = NAN
    guard_window: int = 0

    @property
    def votes(self) -> int:
        """👍 and 👎 together."""
        return self.votes_up + self.votes_down


@dataclass(frozen=True, slots=True)
class Comparison:
    """A non-control variant against the control: differences are variant minus control, all
    with the chat as the unit (bot/reports/variant_stats.py)."""

    variant: str
    control: str
    up_rate_diff: float  # the same as `lift` (the older name); NaN when either has no votes
    z: float  # lift / its chat-level standard error (0 when nothing is known)
    p_value: float  # fixed-horizon chat-level test (read once; see FIXED_SAMPLE_NOTE)
    rating_diff: float  # NaN when either has no ratings
    # The 👍-rate lift with its fixed-horizon chat-level (cluster-robust) 95% interval, NaN
    # with fewer than MIN_CHATS chats with votes on either side.
    lift: float = NAN
    lift_low: float = NAN
    lift_high: float = NAN
    # The always-valid 95% bounds and p-value (variant_stats.always_valid_lift): may be read
    # at any time. (-1, 1, 1.0) when nothing is known yet.
    always_valid_low: float = -1.0
    always_valid_high: float = 1.0
    always_valid_p: float = 1.0
    control_chats: int = 0  # chats with votes on each side
    variant_chats: int = 0
    # The lift of the inverse-propensity rates (hash-assigned chats with a recorded
    # probability), fixed-horizon chat-level: what to read when a bandit moved the shares.
    ipw_lift: float = NAN
    ipw_lift_low: float = NAN
    ipw_lift_high: float = NAN
    ipw_p_value: float = NAN


@dataclass(frozen=True, slots=True)
class ArenaRank:
    """One variant in the arena ranking."""

    name: str
    matches: int  # decided duels it took part in
    wins: int
    ties: int  # "both bad"
    strength: float  # Bradley-Terry strength (geometric mean 1): s_a / s_b = odds a beats b
    low: float  # 95% bootstrap interval
    high: float


@dataclass(frozen=True)
class VariantReport:
    """Everything `admin variants` shows."""

    experiment: str
    control: str
    variants: tuple[VariantFigures, ...]  # the file's order, then ones only the database has
    comparisons: tuple[Comparison, ...]
    srm: SrmResult  # hash-assigned chats against their recorded probabilities (or the weights)
    note: str = REPORT_NOTE
    allocation: str = "weights"  # the experiment's allocation now
    # Whether any assignment recorded its allocation (the SRM line says against what).
    recorded: bool = False
    # Whether a bandit chose any of the chats: then nothing here is a fixed-sample test.
    bandit: bool = False
    # /arena duels: variants ranked by Bradley-Terry strength, strongest first (none: no duels).
    arena: tuple[ArenaRank, ...] = ()
    # `admin variants autopilot`: its policy (None: off), and its decisions, newest first.
    autopilot: dict[str, Any] | None = None
    decisions: tuple[StoredDecision, ...] = ()

    def get(self, name: str) -> VariantFigures | None:
        """The figures of variant `name`, if it is in the report."""
        return next((v for v in self.variants if v.name == name), None)


# --- reading the database --------------------------------------------------------------------


async def _grouped(db: AsyncSession, stmt: Any) -> dict[str, tuple[Any, ...]]:
    return {str(row[0]): tuple(row[1:]) for row in await db.execute(stmt)}


@dataclass
class _Rows:
    """What the report reads, per variant name (current identities only)."""

    assigned: dict[str, tuple[Any, ...]]  # (chats, hash-assigned chats)
    turns: dict[str, tuple[Any, ...]]  # (replies, mean length)
    votes: dict[str, dict[int, ChatVotes]]
    latency: dict[str, list[float]]
    model: dict[str, list[float]]
    ratings: dict[str, dict[int, list[float]]]  # variant -> chat -> its ratings
    weighted: _Weighted

    def names(self) -> set[str]:
        return (
            set(self.assigned)
            | set(self.turns)
            | set(self.votes)
            | set(self.ratings)
            | set(self.weighted.moved_off)
        )


async def variant_report(
    sessionmaker: async_sessionmaker[AsyncSession], experiment: Experiment
) -> VariantReport:
    """Read assignments, replies, votes and ratings per variant and compare them.

    Replies, votes and ratings count for the current identity of their variant only
    (bot.db.variants.current_identity): a name added again, or given another model, starts
    from nothing."""
    async with sessionmaker() as db:
        rows = await _read(db, experiment)
    served = experiment.names
    extra = sorted(rows.names() - set(served))
    control = experiment.control.name
    figures = [_figures(name, experiment, rows) for name in [*served, *extra]]
    base = next(f for f in figures if f.control)
    weighted = rows.weighted
    comparisons = [_compare(base, f, rows.votes, weighted.chats) for f in figures if not f.control]
    srm, expected = _sample_ratio(figures, weighted)
    figures = [
        _with_weighted(f, weighted.chats.get(f.name, {}), expected.get(f.name, NAN))
        for f in figures
    ]
    bandit = weighted.bandit or experiment.allocation == "thompson"
    async with sessionmaker() as db:
        arena = await _arena_ranking(db, experiment.name)
    report = VariantReport(
        experiment.name,
        control,
        tuple(figures),
        tuple(comparisons),
        srm,
        note=f"{BANDIT_NOTE} {REPORT_NOTE}" if bandit else REPORT_NOTE,
        arena=arena,
        allocation=experiment.allocation,
        recorded=weighted.recorded,
        bandit=bandit,
    )
    return await _with_guards(sessionmaker, report)


async def _read(db: AsyncSession, experiment: Experiment) -> _Rows:
    """The report's queries: assignments, replies, votes, latencies, ratings, the splits."""
    is_hash = case((Assignment.source == AssignmentSource.HASH, 1), else_=0)
    replies = (
        Message.role == Role.BOT,
        Message.variant.is_not(None),
        current_identity(Message.variant_version, experiment.name),
    )
    assigned = await _grouped(
        db,
        select(Assignment.variant, func.count(), func.sum(is_hash)).group_by(Assignment.variant),
    )
    turns = await _grouped(
        db,
        select(Message.variant, func.count(), func.avg(func.length(Message.text)))
        .where(*replies)
        .group_by(Message.variant),
    )
    votes = await chat_vote_table(db, identity=experiment.name)
    latency: dict[str, list[float]] = {}
    model: dict[str, list[float]] = {}
    timed = select(Message.variant, Message.latency_ms, Message.model_ms).where(
        *replies, (Message.latency_ms.is_not(None)) | (Message.model_ms.is_not(None))
    )
    for name, latency_ms, model_ms in await db.execute(timed):
        if latency_ms is not None:
            latency.setdefault(str(name), []).append(float(latency_ms))
        if model_ms is not None:
            model.setdefault(str(name), []).append(float(model_ms))
    ratings: dict[str, dict[int, list[float]]] = {}
    for name, chat, value in await db.execute(
        select(Rating.variant, Rating.chat_id, Rating.value).where(
            Rating.variant.is_not(None),
            current_identity(Rating.variant_version, experiment.name),
        )
    ):
        ratings.setdefault(str(name), {}).setdefault(int(chat), []).append(float(value))
    weighted = await _weighted(db, votes)
    return _Rows(assigned, turns, votes, latency, model, ratings, weighted)


def _figures(name: str, experiment: Experiment, rows: _Rows) -> VariantFigures:
    """One variant's figures from what the report read."""
    variant = experiment.get(name)
    chats, chats_hash = rows.assigned.get(name, (0, 0))
    n_turns, chars = rows.turns.get(name, (0, None))
    mine = rows.votes.get(name, {})
    rate = clustered_rate([v.pair for v in mine.values()])
    rating = rating_interval(list(rows.ratings.get(name, {}).values()))
    p50, p95 = latency_percentiles(rows.latency.get(name, []))
    model_p50, _ = latency_percentiles(rows.model.get(name, []))
    return VariantFigures(
        name=name,
        weight=variant.weight if variant is not None else 0.0,
        control=name == experiment.control.name,
        served=variant is not None,
        chats=int(chats or 0),
        chats_hash=int(chats_hash or 0) + rows.weighted.moved_off.get(name, 0),
        turns=int(n_turns or 0),
        votes_up=sum(v.up for v in mine.values()),
        votes_down=sum(v.down for v in mine.values()),
        up_rate=rate.rate,
        up_low=rate.low,
        up_high=rate.high,
        ratings=rating.n,
        rating_mean=rating.mean,
        rating_low=rating.low,
        rating_high=rating.high,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        model_p50_ms=model_p50,
        reply_chars=NAN if chars is None else float(chars),
        vote_chats=rate.chats,
        votes_counted=rate.votes,
        up_effective_votes=rate.effective_votes,
    )


def _sample_ratio(
    figures: Sequence[VariantFigures], weighted: _Weighted
) -> tuple[SrmResult, dict[str, float]]:
    """The sample-ratio check of the hash-assigned chats, and each variant's expected count:
    against the recorded splits where there are any, else against the weights."""
    weights = {f.name: f.weight for f in figures}
    observed = {f.name: f.chats_hash for f in figures}
    if weighted.recorded:
        # Rows without a recorded split (before migration 0008) expect the weights' share.
        total_w = sum(w for w in weights.values() if w > 0)
        expected = {
            name: weighted.expected.get(name, 0.0)
            + (weighted.unrecorded * w / total_w if total_w > 0 and w > 0 else 0.0)
            for name, w in weights.items()
        }
        return sample_ratio_against(observed, expected), expected
    expected = {
        name: (w / sum(weights.values()) * sum(observed.values()) if w > 0 else 0.0)
        for name, w in weights.items()
    }
    return sample_ratio_mismatch(observed, weights), expected


async def _with_guards(
    sessionmaker: async_sessionmaker[AsyncSession], report: VariantReport
) -> VariantReport:
    """The report with each variant's guard metrics, and the autopilot's policy and decisions."""
    async with sessionmaker() as db:
        names = [f.name for f in report.variants]
        guards = await guard_figures(db, names, experiment=report.experiment)
        state = await autopilot_rows.policy(db, report.experiment)
        decided = await autopilot_rows.decisions(db, report.experiment)
    figures = tuple(
        replace(
            f,
            distinct_share=g.distinct_share,
            repetition_share=g.repetition_share,
            safety_share=g.safety_share,
            failed_turns=g.failed_turns,
            failed_share=g.failed_share,
            guard_window=g.window,
        )
        for f in report.variants
        for g in (guards[f.name],)
    )
    policy = state[1] if state is not None else None
    return replace(report, variants=figures, autopilot=policy, decisions=tuple(decided))


def _compare(
    base: VariantFigures,
    f: VariantFigures,
    votes: dict[str, dict[int, ChatVotes]],
    weighted: dict[str, dict[int, tuple[ChatVotes, float]]],
) -> Comparison:
    """`f` against the control `base`: the fixed-horizon and the always-valid chat-level lift,
    and the lift of the inverse-propensity rates."""
    control = [v.pair for v in votes.get(base.name, {}).values()]
    variant = [v.pair for v in votes.get(f.name, {}).values()]
    test = chat_lift_test(control, variant)
    seq = always_valid_lift(control, variant)
    c_ipw = list(weighted.get(base.name, {}).values())
    v_ipw = list(weighted.get(f.name, {}).values())
    ipw = chat_lift_test(
        [v.pair for v, _ in c_ipw],
        [v.pair for v, _ in v_ipw],
        control_weights=[1.0 / p for _, p in c_ipw],
        variant_weights=[1.0 / p for _, p in v_ipw],
    )
    return Comparison(
        variant=f.name,
        control=base.name,
        up_rate_diff=test.lift,
        z=test.z,
        p_value=test.p_value,
        rating_diff=f.rating_mean - base.rating_mean,
        lift=test.lift,
        lift_low=test.low,
        lift_high=test.high,
        always_valid_low=seq.low,
        always_valid_high=seq.high,
        always_valid_p=seq.p_value,
        control_chats=test.chats[0],
        variant_chats=test.chats[1],
        ipw_lift=ipw.lift,
        ipw_lift_low=ipw.low,
        ipw_lift_high=ipw.high,
        ipw_p_value=ipw.p_value if c_ipw and v_ipw else NAN,
    )


@dataclass
class _Weighted:
    # variant -> chat -> (its votes, the probability it was assigned with)
    chats: dict[str, dict[int, tuple[ChatVotes, float]]]
    expected: dict[str, float]  # variant -> sum of the recorded probabilities
    unrecorded: int  # hash-assigned chats without a recorded split
    recorded: bool
    bandit: bool  # some split was not fixed shares (a Thompson draw)
    # variant -> chats the hash drew into it and moved off it since (it was removed)
    moved_off: dict[str, int] = field(default_factory=dict)


async def _weighted(db: AsyncSession, votes: dict[str, dict[int, ChatVotes]]) -> _Weighted:
    """Per variant, its hash-assigned chats' votes on its replies (`votes`: the report's
    chat_vote_table, current identities only) with the probability each chat was assigned
    with; and the sample-ratio check's expected counts.

    The sample-ratio check is about the draws: a chat moved off a removed variant counts at
    the draw it came from (its variant and split as drawn), since leaving it out would leave
    the removed variant's share expected but its chats missing. The weights are about the
    chats whose variant is their draw: moved and fallback chats have none, and are left out
    (a fallback chat had no chance of any other variant, which no weight can correct)."""
    out = _Weighted({}, {}, 0, False, False)
    hashed = select(
        Assignment.chat_id,
        Assignment.variant,
        Assignment.probability,
        Assignment.allocation,
        Assignment.source,
    ).where(Assignment.source.in_([AssignmentSource.HASH, AssignmentSource.MOVED]))
    none = ChatVotes(0, 0, 0.0, 0.0)
    for chat, variant, probability, allocation, source in await db.execute(hashed):
        if source == AssignmentSource.MOVED:
            drawn = json.loads(allocation).get("drawn") if allocation is not None else None
            if drawn is None:
                continue  # no draw behind it (an admin's or a user's move, then removed)
            out.moved_off[str(drawn)] = out.moved_off.get(str(drawn), 0) + 1
            probability = None  # its votes are not on the variant it drew
        if allocation is None:
            out.unrecorded += 1
        else:
            out.recorded = True
            recorded = json.loads(allocation)
            for name, share in recorded.get("split", {}).items():
                out.expected[str(name)] = out.expected.get(str(name), 0.0) + float(share)
            out.bandit = out.bandit or recorded.get("by") == "thompson"
        if probability is not None:
            mine = votes.get(str(variant), {}).get(int(chat), none)
            out.chats.setdefault(str(variant), {})[int(chat)] = (mine, float(probability))
    return out


def _with_weighted(
    f: VariantFigures, chats: dict[int, tuple[ChatVotes, float]], expected: float
) -> VariantFigures:
    rate = ipw_rate([(v.capped_up, v.capped_votes - v.capped_up, p) for v, p in chats.values()])
    return replace(
        f,
        ipw_up_rate=rate.rate,
        ipw_low=rate.low,
        ipw_high=rate.high,
        ipw_chats=rate.chats,
        ipw_effective_chats=rate.effective_chats,
        expected_chats=expected,
    )


async def _arena_ranking(db: AsyncSession, experiment: str) -> tuple[ArenaRank, ...]:
    """Bradley-Terry strengths from the decided duels ("both bad" counts as a tie) between
    the current identities of their variants."""
    rows = await db.execute(
        select(ArenaMatch.variant_a, ArenaMatch.variant_b, ArenaMatch.winner).where(
            ArenaMatch.winner.is_not(None),
            ArenaMatch.variant_a.is_not(None),
            ArenaMatch.variant_b.is_not(None),
            current_identity(ArenaMatch.version_a, experiment),
            current_identity(ArenaMatch.version_b, experiment),
        )
    )
    score = {"a": 1.0, "b": 0.0, "tie": 0.5}
    matches = [(str(a), str(b), score[str(w)]) for a, b, w in rows if a != b and str(w) in score]
    if not matches:
        return ()
    estimates = bradley_terry_bootstrap(matches)
    ranks = []
    for name, est in estimates.items():
        mine = [(a, b, s) for a, b, s in matches if name in (a, b)]
        wins = sum(1 for a, _, s in mine if (s == 1.0) == (a == name) and s != 0.5)
        ties = sum(1 for *_, s in mine if s == 0.5)
        ranks.append(ArenaRank(name, len(mine), wins, ties, est.strength, est.low, est.high))
    ranks.sort(key=lambda r: -r.strength)
    return tuple(ranks)
