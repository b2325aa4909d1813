"""Bandit-aware figures: each assignment records the probability it was made with, the report
weights by it (inverse-propensity next to the naive rates), the sample-ratio check expects the
sums of the recorded probabilities, and the note says a bandit's figures are not a fixed-sample
test. On SQLite and PostgreSQL, every expected figure worked out by hand in the comments."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import cast

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.conversations.store import ConversationStore
from bot.db.models import Assignment, Session
from bot.engine.bandit import thompson_split
from bot.engine.router import VariantResponder
from bot.engine.spec import Backend
from bot.engine.variants import Experiment, Variant
from bot.reports.variant_stats import BANDIT_NOTE
from bot.reports.variants import REPORT_NOTE, VariantReport, variant_report
from bot.reports.variants_json import report_json
from bot.reports.variants_text import format_variant_report
from tests.support.dbutil import add_assignment, add_voted_replies

DAY = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EXPERIMENT = Experiment(
    "bandit-test",
    (Variant("a", "zoo:x", 1.0, True), Variant("b", "zoo:x", 1.0, False)),
    "thompson",
)


async def seed(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """chat  variant source  probability  split (a, b)   votes on its variant's replies
    1     a       hash    0.5          0.5, 0.5       +1 -1
    2     a       hash    0.8          0.8, 0.2       +1 +1
    3     b       hash    0.2          0.8, 0.2       +1 -1
    4     b       hash    0.5          0.5, 0.5       -1 -1
    5     a       admin   -            -              +1 +1 +1
    6     b       hash    0.25         0.75, 0.25     (none)
    """
    rows = [
        (1, "a", "hash", 0.5, {"a": 0.5, "b": 0.5}, [1, -1]),
        (2, "a", "hash", 0.8, {"a": 0.8, "b": 0.2}, [1, 1]),
        (3, "b", "hash", 0.2, {"a": 0.8, "b": 0.2}, [1, -1]),
        (4, "b", "hash", 0.5, {"a": 0.5, "b": 0.5}, [-1, -1]),
        (5, "a", "admin", None, None, [1, 1, 1]),
        (6, "b", "hash", 0.25, {"a": 0.75, "b": 0.25}, []),
    ]
    async with sessionmaker.begin() as db:
        for chat, variant, source, p, split, votes in rows:
            allocation = None if split is None else json.dumps({"by": "thompson", "split": split})
            add_assignment(
                db, chat, EXPERIMENT.name, variant, DAY, source=source, probability=p,
                allocation=allocation,
            )  # fmt: skip
            s = Session(chat_id=chat, user_id=chat, created_at=DAY)
            db.add(s)
            await db.flush()
            await add_voted_replies(db, s.id, chat, variant, [(chat, v) for v in votes], DAY)


@pytest.fixture
async def report(sessionmaker: async_sessionmaker[AsyncSession]) -> VariantReport:
    """The variant report on `seed`'s rows."""
    await seed(sessionmaker)
    return await variant_report(sessionmaker, EXPERIMENT)


async def test_the_report_weights_by_the_recorded_probabilities(
    report: VariantReport,
) -> None:
    a, b = report.variants
    # Naive: a 6 up of 7 (chat 5's admin-moved votes count here); b 1 up of 4.
    assert (a.up_rate, b.up_rate) == (pytest.approx(6 / 7), pytest.approx(0.25))
    # IPW (self-normalised): w = 1/p per chat, hash-assigned chats with a probability only.
    # a: chat 1 w 2 (1 up, 1 down), chat 2 w 1.25 (2 up): (2 + 2.5) / (4 + 2.5) = 9/13.
    assert a.ipw_up_rate == pytest.approx(9 / 13)
    # Two chats are fewer than MIN_CHATS (5): no interval, whatever the weights (the chat-level
    # variance from two chats is not worth a number; tests/unit/reports/test_chat_level.py
    # checks the weighted interval by hand on more chats).
    assert math.isnan(a.ipw_low) and math.isnan(a.ipw_high)
    # effective chats: (2 + 1.25)^2 / (4 + 1.5625) = 10.5625 / 5.5625
    assert (a.ipw_chats, a.ipw_effective_chats) == (2, pytest.approx(10.5625 / 5.5625))
    # b: chat 3 w 5 (1 up, 1 down), chat 4 w 2 (2 down); chat 6 has no votes: 5 / 14.
    assert b.ipw_up_rate == pytest.approx(5 / 14)
    assert math.isnan(b.ipw_low) and math.isnan(b.ipw_high)
    assert b.ipw_chats == 2
    # SRM against the recorded splits: hash chats a 2 (1, 2), b 3 (3, 4, 6); expected
    # a = .5 + .8 + .8 + .5 + .75 = 3.35, b = .5 + .2 + .2 + .5 + .25 = 1.65;
    # chi2 = 1.35^2 / 3.35 + 1.35^2 / 1.65 = 1.6485753 (against the weights it would be
    # 0.5^2 / 2.5 * 2 = 0.2), p = 0.19915.
    assert (a.expected_chats, b.expected_chats) == (pytest.approx(3.35), pytest.approx(1.65))
    assert report.srm.chi2 == pytest.approx(1.6485753053)
    assert report.srm.p_value == pytest.approx(0.1991529506)
    assert report.srm.dof == 1 and not report.srm.warn
    assert report.bandit and report.recorded
    assert report.note == f"{BANDIT_NOTE} {REPORT_NOTE}"
    # The IPW lift: 5/14 - 9/13, too few chats for its interval.
    (c,) = report.comparisons
    assert c.ipw_lift == pytest.approx(5 / 14 - 9 / 13) and math.isnan(c.ipw_lift_low)

    text = format_variant_report(report)
    assert "  a: 69.2% [n/a (too few)] (85.7%), 2 chats (worth 1.9 equally weighted)" in text
    assert "  b: 35.7% [n/a (too few)] (25.0%), 2 chats (worth 1.7 equally weighted)" in text
    assert "  b vs a (IPW, fixed horizon): -33.5 pp, 95% CI n/a (too few), p = 1.000" in text
    assert (
        "sample ratio (hash-assigned chats against their recorded allocation probabilities): "
        "chi2 = 1.65, df 1, p = 0.199, ok"
    ) in text
    assert "Note: Bandit allocation: the shares of new chats followed the votes" in (
        " ".join(text.split())
    )
    data = report_json(report)
    assert data["bandit"] is True and data["recorded_probabilities"] is True
    assert data["variants"][0]["ipw_up_rate"] == pytest.approx(9 / 13)


async def test_fixed_weights_keep_the_plain_note_and_equal_ipw_and_naive(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    # One probability for every chat: the IPW rate is the naive one.
    async with sessionmaker.begin() as db:
        for chat, variant in ((1, "a"), (2, "b")):
            split = json.dumps({"by": "weights", "split": {"a": 0.5, "b": 0.5}})
            add_assignment(db, chat, "fixed", variant, DAY, probability=0.5, allocation=split)
    fixed = Experiment("fixed", EXPERIMENT.variants, "weights")
    report = await variant_report(sessionmaker, fixed)
    assert not report.bandit and report.recorded
    assert report.note == REPORT_NOTE
    assert report.srm.chi2 == 0.0  # 1 and 1 against 1 and 1


async def test_a_thompson_assignment_records_the_probability_it_was_drawn_with(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await seed(sessionmaker)
    # The votes per variant: a 6 up 1 down (all its replies), b 1 up 3 down.
    want = thompson_split({"a": (6, 1), "b": (1, 3)})
    store = ConversationStore(sessionmaker)
    # Both variants served (a chat is only drawn into a variant whose backend is up);
    # assignment never calls a backend, so one that only says it is up stands in for it.
    served = {name: cast(Backend, SimpleNamespace(alive=True)) for name in EXPERIMENT.names}
    router = VariantResponder(EXPERIMENT, served, store)
    for chat in range(100, 130):
        session = await store.active_session(chat)
        variant = await router.variant_for(session)
        async with sessionmaker() as db:
            row = await db.scalar(select(Assignment).where(Assignment.chat_id == chat))
        assert row is not None and row.variant == variant and row.source == "hash"
        assert row.probability == pytest.approx(want[variant])
        recorded = json.loads(row.allocation or "{}")
        assert recorded["by"] == "thompson"
        assert recorded["split"] == pytest.approx(want)
