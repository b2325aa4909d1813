"""The autopilot's verdict from figures (bot.service.autopilot.judge): each guard at and just
past its threshold, the lift bound's three cases, and waiting below the minimum samples."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bot.reports.guards import GuardFigures
from bot.reports.variant_stats import SequentialLift
from bot.service.autopilot import PROMOTE, ROLLBACK, Policy, breaches, judge

POLICY = Policy()  # distinct 0.9x, repetition +0.05, safety +0.02, failed +0.02, p95 1.5x
BASE = GuardFigures(
    replies=400,
    window=400,
    distinct_share=0.9,
    repetition_share=0.1,
    safety_flags=4,
    safety_share=0.01,
    failed_turns=4,
    failed_share=0.01,
    latency_p95_ms=1000.0,
)
WINS = SequentialLift(lift=0.08, low=0.01, high=0.15, p_value=0.01, chats=(40, 40))
UNSURE = SequentialLift(lift=0.03, low=-0.02, high=0.08, p_value=0.4, chats=(40, 40))
LOSES = SequentialLift(lift=-0.08, low=-0.15, high=-0.01, p_value=0.01, chats=(40, 40))


@pytest.mark.parametrize(
    ("field", "at", "past", "words"),
    [
        ("distinct_share", 0.81, 0.80, "distinct replies 80.0% < 0.9 x the control's 90.0%"),
        ("repetition_share", 0.15, 0.16, "repetitive replies 16.0% > the control's 10.0% + 5 pp"),
        ("safety_share", 0.03, 0.031, "safety-gate flags 3.1% > the control's 1.0% + 2 pp"),
        ("failed_share", 0.03, 0.031, "failed turns 3.1% > the control's 1.0% + 2 pp"),
        ("latency_p95_ms", 1500.0, 1501.0, "latency p95 1501 ms > 1.5 x the control's 1000 ms"),
    ],
)
def test_each_guard_holds_at_its_threshold_and_breaches_past_it(
    field: str, at: float, past: float, words: str
) -> None:
    # 0.9 x 0.9 = 0.81: at the threshold is not below it (floating point: 0.81 vs 0.81).
    assert breaches(BASE, replace(BASE, **{field: at}), POLICY) == []
    assert breaches(BASE, replace(BASE, **{field: past}), POLICY) == [
        words + (" (last 400 replies each)" if field == "distinct_share" else "")
    ]
    verdict = judge("b", WINS, BASE, replace(BASE, **{field: past}), POLICY)
    assert verdict.action == ROLLBACK and verdict.reason == f"guard breached: {words}" + (
        " (last 400 replies each)" if field == "distinct_share" else ""
    )


def test_guards_wait_for_min_replies_and_missing_timings_never_breach() -> None:
    few = replace(BASE, replies=199, distinct_share=0.1)
    assert breaches(BASE, few, POLICY) == []  # 199 < 200: not judged
    untimed = replace(BASE, latency_p95_ms=math.nan)
    assert breaches(BASE, untimed, POLICY) == breaches(untimed, BASE, POLICY) == []


def test_the_lift_bound_promotes_waits_or_rolls_back() -> None:
    assert judge("b", WINS, BASE, BASE, POLICY).action == PROMOTE
    assert judge("b", WINS, BASE, BASE, POLICY).reason == (
        "surely more 👍 than the control: always-valid 95% bounds +1.0..+15.0 pp "
        "(lift +8.0 pp, 40 vs 40 voting chats); no guard regressed"
    )
    waiting = judge("b", UNSURE, BASE, BASE, POLICY)
    assert waiting.action is None and waiting.reason.startswith("waiting: lower bound not above 0")
    assert judge("b", LOSES, BASE, BASE, POLICY).action == ROLLBACK
    # A winner waits for min_chats voting chats a side, and for the guards to be judged.
    few_chats = replace(WINS, chats=(40, 29))
    assert judge("b", few_chats, BASE, BASE, POLICY).reason == (
        "waiting: fewer than 30 voting chats a side"
    )
    unjudged = judge("b", WINS, BASE, replace(BASE, replies=10), POLICY)
    assert unjudged.action is None
    assert unjudged.reason == "waiting: fewer than 200 replies a side to judge the guards"
