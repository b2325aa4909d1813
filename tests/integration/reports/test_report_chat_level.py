"""The variants report with enough chats for chat-level figures, on SQLite and PostgreSQL: the
interval, the lift, the always-valid bound, the per-user cap and the ratings, each worked out by
hand in the comments; the same figures in the text, in `admin variants --json` and on /stats."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.admin.cli import admin
from bot.db.models import Rating, Session
from bot.engine.variants import Experiment, Variant
from bot.reports import stats as service_stats
from bot.reports.chat_votes import chat_votes
from bot.reports.variant_stats import always_valid_lift
from bot.reports.variants import VariantReport, variant_report
from bot.reports.variants_text import format_variant_report
from tests.integration.admin.test_admin import parse_admin
from tests.support.dbutil import add_assignment, add_voted_replies

DAY = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EXPERIMENT = Experiment(
    "chat-level",
    (Variant("a", "zoo:x", 1.0, True), Variant("b", "zoo:x", 1.0, False)),
)
Z = 1.959963984540054

# chat: (variant, [(user, vote), ...], ratings)
SEED: dict[int, tuple[str, list[tuple[int, int]], list[int]]] = {
    1: ("a", [(1, 1), (1, 1)], [5]),
    2: ("a", [(2, -1), (2, -1)], [1]),
    3: ("a", [(3, 1), (3, -1)], [3]),
    4: ("a", [(4, 1), (4, 1)], [4, 5]),
    5: ("a", [(5, -1), (5, -1)], [2]),
    6: ("b", [(6, 1), (6, 1)], []),
    7: ("b", [(7, 1), (7, 1)], []),
    8: ("b", [(8, 1), (8, -1)], []),
    9: ("b", [(9, 1), (9, 1)], []),
    10: ("b", [(10, 1), (10, -1)], []),
    # one account voting 👍 thirty times: it counts for 10 votes (USER_VOTE_CAP)
    11: ("b", [(99, 1)] * 30, []),
}


async def seed(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    async with sessionmaker.begin() as db:
        for chat, (variant, votes, ratings) in SEED.items():
            add_assignment(db, chat, EXPERIMENT.name, variant, DAY)
            for value in ratings or [None]:
                s = Session(chat_id=chat, user_id=chat, status="done", created_at=DAY)
                db.add(s)
                await db.flush()
                if value is not None:
                    db.add(
                        Rating(
                            chat_id=chat,
                            session_id=s.id,
                            user_id=chat,
                            value=value,
                            variant=variant,
                            created_at=DAY,
                        )
                    )
            await add_voted_replies(db, s.id, chat, variant, votes, DAY)


# Control a: chats (up, votes) (2,2) (0,2) (1,2) (2,2) (0,2): r = 5/10; CR1 variance
# 5/4 * (1 + 1 + 0 + 1 + 1) / 10^2 = 0.05, effective votes 0.25 / 0.05 = 5:
# Wilson(0.5, 5) = 0.5 -+ 0.3295764 (worked out in tests/unit/reports/test_chat_level.py).
A_INTERVAL = (0.5 - 0.3295764, 0.5 + 0.3295764)
# Variant b: (2,2) (2,2) (1,2) (2,2) (1,2) and chat 11's 30 👍 capped to (10, 10):
# r = 18/20 = 0.9. Residuals up - 0.9 votes: 0.2 (three chats), -0.8 (two), 1.0 (chat 11);
# squares 0.12 + 1.28 + 1 = 2.4; CR1 6/5 * 2.4 / 400 = 0.0072.
# Lift 0.9 - 0.5 = 0.4. Pooled rate (5 + 18) / 30 = 23/30; its binomial variance per side
# (23/30)(7/30) / 10 = 0.0178889 (below a's 0.05) and / 20 = 0.0089444 (above b's 0.0072: b is
# floored). var = 0.05 + 0.0089444 = 0.0589444, se = 0.2427848, z = 1.6475498,
# p = erfc(1.6475498 / sqrt 2) = 0.0994451; interval 0.4 -+ 1.959964 * 0.2427848.
LIFT_VAR = 0.05 + (23 / 30) * (7 / 30) / 20
P_FIXED = 0.0994451
# Always valid, tuned for 1000 chats and read at 11: s = 7.9361546 * 11 / 1000 = 0.0872977;
# half = sqrt(0.0589444 * 12.4550554 * ln(1.0872977 / 0.0025)) = sqrt(0.0589444 * 12.4550554
# * 6.0751600) = 2.1118989: both ends clipped to -1 and 1;
# p = sqrt(1.0872977) exp(-0.16 * 0.0872977 / (2 * 0.0589444 * 1.0872977)) = 0.9350821.
P_ALWAYS = 0.9350821


@pytest.fixture
async def report(sessionmaker: async_sessionmaker[AsyncSession]) -> VariantReport:
    """The variant report on `seed`'s rows."""
    await seed(sessionmaker)
    return await variant_report(sessionmaker, EXPERIMENT)


async def test_the_report_is_chat_level_with_the_per_user_cap(
    sessionmaker: async_sessionmaker[AsyncSession], report: VariantReport
) -> None:
    a, b = report.variants
    assert (a.votes_up, a.votes_down, a.vote_chats, a.votes_counted) == (5, 5, 5, 10.0)
    assert a.up_rate == pytest.approx(0.5)
    assert (a.up_low, a.up_high) == pytest.approx(A_INTERVAL, abs=1e-6)
    assert a.up_effective_votes == pytest.approx(5.0)
    # b as cast: 8 + 30 = 38 👍 of 40; the 👍 rate counts user 99 as 10 votes: 18 of 20.
    assert (b.votes_up, b.votes_down, b.vote_chats) == (38, 2, 6)
    assert b.votes_counted == pytest.approx(20.0) and b.up_rate == pytest.approx(0.9)
    assert 0.0 <= b.up_low < 0.9 < b.up_high <= 1.0

    (c,) = report.comparisons
    assert c.lift == pytest.approx(0.4) and c.up_rate_diff == pytest.approx(0.4)
    assert c.z == pytest.approx(0.4 / math.sqrt(LIFT_VAR))
    assert c.p_value == pytest.approx(P_FIXED, abs=1e-6)
    half = Z * math.sqrt(LIFT_VAR)
    assert (c.lift_low, c.lift_high) == pytest.approx((0.4 - half, 0.4 + half))
    assert (c.always_valid_low, c.always_valid_high) == (-1.0, 1.0)
    assert c.always_valid_p == pytest.approx(P_ALWAYS, abs=1e-6)
    assert (c.control_chats, c.variant_chats) == (5, 6)
    # The report's always-valid figures are always_valid_lift on chat_votes (what the
    # autopilot reads).
    async with sessionmaker() as db:
        pairs = await chat_votes(db)
    seq = always_valid_lift(pairs["a"], pairs["b"])
    assert (seq.low, seq.high, seq.p_value) == (
        c.always_valid_low,
        c.always_valid_high,
        c.always_valid_p,
    )

    # Ratings of a: chats 1..5 rated 5, 1, 3, (4, 5), 2: mean 20/6; five rated chats: an
    # interval inside 1..5. b has none.
    assert a.ratings == 6 and a.rating_mean == pytest.approx(20 / 6)
    assert 1.0 <= a.rating_low < 20 / 6 < a.rating_high <= 5.0
    assert b.ratings == 0 and math.isnan(b.rating_low)

    text = format_variant_report(report)
    lines = text.splitlines()
    at = lines.index(
        "b vs a: up rate +40.0 pp (90.0% vs 50.0%), chats with votes 6 vs 5; mean rating n/a"
    )
    assert lines[at + 1] == (
        "  always valid (read any time): -100.0..+100.0 pp, p = 0.935: "
        "no decision yet (the bound contains 0)"
    )
    assert lines[at + 2] == (
        f"  fixed horizon (read once): 95% CI {100 * (0.4 - half):+.1f}..{100 * (0.4 + half):+.1f}"
        " pp, z = 1.65, p = 0.099"
    )
    assert "may be read at any time" in " ".join(text.split())


async def test_admin_variants_json_has_the_chat_level_fields(
    sessionmaker: async_sessionmaker[AsyncSession], db_url: str
) -> None:
    await seed(sessionmaker)
    out = io.StringIO()
    status = await admin(db_url, parse_admin("variants", "--json"), out, experiment=EXPERIMENT)
    assert status == 0
    data = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    (c,) = data["comparisons"]
    for field in (
        "lift",
        "lift_low",
        "lift_high",
        "always_valid_low",
        "always_valid_high",
        "always_valid_p",
        "control_chats",
        "variant_chats",
        "ipw_lift",
    ):
        assert field in c, field
    assert c["lift"] == pytest.approx(0.4) and c["p_value"] == pytest.approx(P_FIXED, abs=1e-6)
    assert c["always_valid_p"] == pytest.approx(P_ALWAYS, abs=1e-6)
    assert c["ipw_lift"] is None  # no probabilities recorded
    a, b = data["variants"]
    assert (a["up_low"], a["up_high"]) == pytest.approx(A_INTERVAL, abs=1e-6)
    assert (b["vote_chats"], b["votes_counted"], b["votes"]) == (6, pytest.approx(20.0), 40)
    assert "always-valid" in data["note"]


async def test_stats_show_the_same_rate_and_interval(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await seed(sessionmaker)
    got = {v.name: v for v in (await service_stats.stats(sessionmaker)).variants}
    a = got["a"]
    assert (a.up_rate, a.up_low, a.up_high) == pytest.approx((0.5, *A_INTERVAL), abs=1e-6)
    lines = service_stats.format_stats(await service_stats.stats(sessionmaker)).splitlines()
    assert "variant a: 5 chats, 10 replies, 👍 50% (10 votes in 5 chats; 95% CI 17-83%)" in lines
    assert "variant b: 6 chats, 40 replies, 👍 90% (40 votes in 6 chats; " in "\n".join(lines)
