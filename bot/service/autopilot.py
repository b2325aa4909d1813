"""The autopilot: `admin variants autopilot on` promotes a candidate that wins on 👍 votes and
rolls back one that breaks a guard, on its own, from every replica, deciding once.

Every replica runs `run_forever`: each POLL_S it reads the experiment's row (its version and
`experiments.autopilot`, the policy, NULL when off), so `on` and `off` reach every replica
within seconds; while it is on, each `interval_s` it runs `check`.

A check reads the figures of the control and of every candidate (a served variant with a weight
above 0 that is not the control): the always-valid bound on the 👍 lift
(bot.reports.variant_stats.always_valid_lift over bot.reports.chat_votes.chat_votes, the chat as
the unit, each user's votes capped) and the guard metrics (bot.reports.guards). Then, per
candidate (`judge`):

- rollback (its weight becomes 0: no new chats; its chats keep it) when a guard breaches
  (see Policy), or when the always-valid upper bound on the lift is below 0 (surely worse);
  if no other variant keeps a weight above 0, the control gets weight 1;
- promote (it becomes the control and every other variant's weight becomes 0, so it takes
  every new chat; existing chats keep their variants) when the always-valid lower bound on the
  lift is above 0 with at least `min_chats` voting chats on each side, and every guard was
  judged (at least `min_replies` replies each) and none regressed.

A rollback goes first; at most one decision per check. The decision is one transaction that
moves the experiment's version on only if it is still the one the check read
(bot.db.autopilot.claim) and stores the decision, unique per (experiment, that version), with
its figures and reason: two replicas checking at the same moment make one decision, and any
change in between (an admin command, `autopilot off`) voids a check's decision. Replicas follow
the new version as they follow every `admin variants` change (bot.engine.router).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import audit
from bot.db import autopilot as decisions
from bot.db import variants as stored
from bot.db.models import AuditSource
from bot.reports.chat_votes import chat_votes
from bot.reports.guards import GuardFigures, guard_figures
from bot.reports.variant_stats import SequentialLift, always_valid_lift
from bot.reports.variants_json import json_ready

log = logging.getLogger(__name__)

POLL_S = 10.0  # how often every replica reads whether the autopilot is on
PROMOTE = "promote"
ROLLBACK = "rollback"


class PolicyError(ValueError):
    """A policy value out of range; the message says which and what is allowed."""


@dataclass(frozen=True, slots=True)
class Policy:
    """When the autopilot acts; stored as JSON in `experiments.autopilot`.

    Guards compare the candidate with the control and breach when (each judged only once both
    have `min_replies` replies; latency only where both have timings):
      distinct share  < distinct_ratio x the control's (over the same number of recent replies)
      repetition share > the control's + repetition_margin
      safety share     > the control's + safety_margin
      failed share     > the control's + failed_margin
      latency p95      > latency_ratio x the control's
    """

    min_chats: int = 30  # voting chats on each side before a promotion
    min_replies: int = 200  # replies on each side before any guard is judged
    distinct_ratio: float = 0.9
    repetition_margin: float = 0.05
    safety_margin: float = 0.02
    failed_margin: float = 0.02
    latency_ratio: float = 1.5
    interval_s: float = 60.0  # between two checks of one replica

    def __post_init__(self) -> None:
        if self.min_chats < 5:
            # always_valid_lift knows nothing below five chats a side (variant_stats.MIN_CHATS).
            raise PolicyError(f"min_chats must be at least 5, not {self.min_chats}")
        if self.min_replies < 1:
            raise PolicyError(f"min_replies must be at least 1, not {self.min_replies}")
        if not 0.0 < self.distinct_ratio <= 1.0:
            raise PolicyError(f"distinct_ratio must lie in (0, 1], not {self.distinct_ratio:g}")
        for name in ("repetition_margin", "safety_margin", "failed_margin"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise PolicyError(f"{name} must lie in [0, 1) (a share), not {value:g}")
        if not 1.0 <= self.latency_ratio <= 100.0:
            raise PolicyError(f"latency_ratio must lie in [1, 100], not {self.latency_ratio:g}")
        if not 1.0 <= self.interval_s <= 86400.0:
            raise PolicyError(f"interval_s must lie in [1, 86400] seconds, not {self.interval_s:g}")

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        """A stored policy (unknown keys, from a later release, are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the figures say about one candidate."""

    variant: str
    action: str | None  # PROMOTE, ROLLBACK, or None (wait)
    reason: str
    breaches: tuple[str, ...]
    lift: SequentialLift
    control_guards: GuardFigures
    guards: GuardFigures


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision a check made and stored."""

    experiment: str
    based_on: int
    variant: str
    control: str
    action: str
    reason: str
    figures: dict[str, Any]


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def breaches(control: GuardFigures, candidate: GuardFigures, policy: Policy) -> list[str]:
    """The guards the candidate breaches against the control, in words (none when too few
    replies to judge)."""
    if min(control.replies, candidate.replies) < policy.min_replies:
        return []
    out: list[str] = []
    c, v = control, candidate
    if v.distinct_share < policy.distinct_ratio * c.distinct_share:
        out.append(
            f"distinct replies {_pct(v.distinct_share)} < {policy.distinct_ratio:g} x the "
            f"control's {_pct(c.distinct_share)} (last {min(c.window, v.window)} replies each)"
        )
    if v.repetition_share > c.repetition_share + policy.repetition_margin:
        out.append(
            f"repetitive replies {_pct(v.repetition_share)} > the control's "
            f"{_pct(c.repetition_share)} + {100 * policy.repetition_margin:g} pp"
        )
    if v.safety_share > c.safety_share + policy.safety_margin:
        out.append(
            f"safety-gate flags {_pct(v.safety_share)} > the control's {_pct(c.safety_share)} "
            f"+ {100 * policy.safety_margin:g} pp"
        )
    if v.failed_share > c.failed_share + policy.failed_margin:
        out.append(
            f"failed turns {_pct(v.failed_share)} > the control's {_pct(c.failed_share)} "
            f"+ {100 * policy.failed_margin:g} pp"
        )
    if v.latency_p95_ms > policy.latency_ratio * c.latency_p95_ms:
        out.append(
            f"latency p95 {v.latency_p95_ms:.0f} ms > {policy.latency_ratio:g} x the control's "
            f"{c.latency_p95_ms:.0f} ms"
        )
    return out


def judge(
    variant: str,
    lift: SequentialLift,
    control: GuardFigures,
    candidate: GuardFigures,
    policy: Policy,
) -> Judgement:
    """Promote, roll back or wait (pure: the figures in, the verdict out)."""
    found = breaches(control, candidate, policy)
    pp = f"lift {100 * lift.lift:+.1f} pp" if math.isfinite(lift.lift) else "lift n/a"
    bound = (
        f"always-valid 95% bounds {100 * lift.low:+.1f}..{100 * lift.high:+.1f} pp "
        f"({pp}, {lift.chats[1]} vs {lift.chats[0]} voting chats)"
    )

    def verdict(action: str | None, reason: str) -> Judgement:
        return Judgement(variant, action, reason, tuple(found), lift, control, candidate)

    if found:
        return verdict(ROLLBACK, "guard breached: " + "; ".join(found))
    if lift.high < 0.0:
        return verdict(ROLLBACK, f"surely fewer 👍 than the control: {bound}")
    judged = min(control.replies, candidate.replies) >= policy.min_replies
    enough = min(lift.chats) >= policy.min_chats
    if lift.low > 0.0 and enough and judged:
        return verdict(PROMOTE, f"surely more 👍 than the control: {bound}; no guard regressed")
    waiting = []
    if not lift.low > 0.0:
        waiting.append(f"lower bound not above 0 ({bound})")
    if not enough:
        waiting.append(f"fewer than {policy.min_chats} voting chats a side")
    if not judged:
        waiting.append(f"fewer than {policy.min_replies} replies a side to judge the guards")
    return verdict(None, "waiting: " + "; ".join(waiting))


async def evaluate(
    db: AsyncSession, experiment: str, control: str, candidates: list[str], policy: Policy
) -> list[Judgement]:
    """Judge every candidate against the control from the stored rows."""
    votes = await chat_votes(db, experiment)
    guards = await guard_figures(db, [control, *candidates], experiment=experiment)
    out = []
    for name in candidates:
        base, mine = guards[control], guards[name]
        # The distinct share is compared over as many replies on each side.
        window = min(base.window, mine.window)
        if window and window < max(base.window, mine.window):
            same = await guard_figures(db, [control, name], window=window, experiment=experiment)
            base, mine = same[control], same[name]
        lift = always_valid_lift(votes.get(control, []), votes.get(name, []))
        out.append(judge(name, lift, base, mine, policy))
    return out


def _choose(judged: list[Judgement]) -> Judgement | None:
    """The decision of this check: the first rollback, else the promotion with the highest
    lower bound."""
    rollbacks = [j for j in judged if j.action == ROLLBACK]
    if rollbacks:
        return rollbacks[0]
    promotions = [j for j in judged if j.action == PROMOTE]
    return max(promotions, key=lambda j: j.lift.low) if promotions else None


async def check(
    sessionmaker: async_sessionmaker[AsyncSession],
    experiment: str,
    *,
    decided_by: str,
    policy: Policy | None = None,
) -> Decision | None:
    """One check: judge the candidates and act on at most one; the decision if one was made
    (None: the autopilot is off, nothing to do, or another check decided first).

    `policy`: judge by this one even if the stored one says otherwise (`admin variants
    autopilot check`); by default the stored one, and nothing while it is off.
    """
    async with sessionmaker() as db:
        state = await decisions.policy(db, experiment)
        if state is None:
            return None
        seen, stored_policy = state
        if policy is None:
            if stored_policy is None:
                return None
            policy = Policy.from_json(stored_policy)
        row = await stored.load(db, experiment)
        if row is None or row.version != seen:
            return None  # changed between the two reads: the next check sees it settled
        control = next((v for v in row.variants if v.control), None)
        if control is None:
            return None
        candidates = [v.name for v in row.variants if not v.control and v.weight > 0]
        if not candidates:
            return None
        judged = await evaluate(db, experiment, control.name, candidates, policy)
    chosen = _choose(judged)
    for j in judged:
        log.debug("autopilot %s: %s: %s", experiment, j.variant, j.reason)
    if chosen is None or chosen.action is None:
        return None
    weights_before = {v.name: v.weight for v in row.variants}
    after = _weights_after(chosen, control.name, weights_before)
    figures = json_ready(
        {
            "lift": asdict(chosen.lift),
            "guards": {
                "control": asdict(chosen.control_guards),
                "candidate": asdict(chosen.guards),
            },
            "breaches": list(chosen.breaches),
            "policy": policy.to_json(),
            "weights_before": weights_before,
            "weights_after": after,
        }
    )
    decision = Decision(
        experiment, seen, chosen.variant, control.name, chosen.action, chosen.reason, figures
    )
    async with sessionmaker.begin() as db:
        if not await decisions.claim(db, experiment, seen):
            return None  # another replica decided, or something changed: judged again later
        await _apply(db, decision, decided_by, weights_before, after)
    log.warning(
        "autopilot %s: %s %s (control %s): %s",
        experiment,
        "promoted" if decision.action == PROMOTE else "rolled back",
        decision.variant,
        decision.control,
        decision.reason,
    )
    return decision


def _weights_after(chosen: Judgement, control: str, before: dict[str, float]) -> dict[str, float]:
    """The weights once `chosen` is acted on: a rollback drains the candidate (the control
    takes the new chats if nothing else has a weight), a promotion gives it every new chat."""
    after = dict(before)
    if chosen.action == ROLLBACK:
        after[chosen.variant] = 0.0
        if not any(w > 0 for w in after.values()):
            after[control] = 1.0
        return after
    return {name: (w if name == chosen.variant else 0.0) for name, w in after.items()}


async def _apply(
    db: AsyncSession,
    decision: Decision,
    decided_by: str,
    weights_before: dict[str, float],
    after: dict[str, float],
) -> None:
    """Record the claimed decision, change the variants, and write its audit row, in the
    claim's transaction."""
    experiment, seen = decision.experiment, decision.based_on
    if not await decisions.record(db, **asdict(decision), decided_by=decided_by):
        # Unreachable while every change bumps the version first; the unique key is the
        # second lock on the door. Raising rolls the claim back.
        raise RuntimeError(f"autopilot decision for {experiment} v{seen} exists already")
    if decision.action == PROMOTE:
        await stored.set_control(db, experiment, decision.variant)
    for name, weight in after.items():
        if weight != weights_before[name]:
            await stored.set_weight(db, experiment, name, weight)
    # The audit log's row commits with the decision (bot/db/audit.py).
    await audit.record(
        db,
        actor=audit.autopilot_actor(decided_by),
        source=AuditSource.AUTOPILOT,
        action=f"variants {decision.action}",
        target=decision.variant,
        details={
            "experiment": experiment,
            "based_on": seen,
            "control": decision.control,
            "reason": decision.reason,
            "weights_before": weights_before,
            "weights_after": after,
        },
        result=audit.OK,
    )


async def run_forever(
    sessionmaker: async_sessionmaker[AsyncSession],
    experiment: str,
    *,
    owner: str,
    poll_s: float | None = None,
) -> None:
    """Every `poll_s` (default POLL_S) read whether the autopilot is on, and run a check every
    `interval_s` while it is; failures are logged and tried again (the database may be away)."""
    poll_s = POLL_S if poll_s is None else poll_s
    last = -math.inf
    failures = 0
    while True:
        await asyncio.sleep(poll_s)
        try:
            async with sessionmaker() as db:
                state = await decisions.policy(db, experiment)
            if state is None or state[1] is None:
                last = -math.inf  # on again later: check at once
                continue
            policy = Policy.from_json(state[1])
            if time.monotonic() - last < policy.interval_s:
                continue
            last = time.monotonic()
            await check(sessionmaker, experiment, decided_by=owner)
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the database is away, or a bad row: go on
            failures += 1
            if failures == 1 or failures % 30 == 0:
                log.warning("autopilot check failed (%s: %s)", type(err).__name__, err)
