"""Chat-level statistics (bot/reports/variant_stats.py): the cluster-robust 👍-rate interval and
lift test checked by hand and against a generic sandwich computation, the always-valid bound by
hand and by a simulated A/A experiment watched after every batch, and the rating interval's
bounds. The arithmetic is in the comments; the simulations are seeded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bot.reports.variant_stats import (
    DESIGN_ALPHA,
    MIN_CHATS,
    always_valid_lift,
    chat_lift_test,
    clustered_rate,
    ipw_rate,
    rating_interval,
    two_proportion_test,
)

Z = 1.959963984540054

# Five control chats of two votes each: 5 👍 of 10 votes.
CONTROL = [(2, 2), (0, 2), (1, 2), (2, 2), (0, 2)]


def test_clustered_rate_by_hand() -> None:
    # r = 5 / 10 = 0.5. Residuals up_i - r votes_i: 2-1, 0-1, 1-1, 2-1, 0-1 = 1, -1, 0, 1, -1;
    # their squares sum to 4. CR1: G / (G - 1) * 4 / (sum votes)^2 = 5/4 * 4 / 100 = 0.05,
    # se = sqrt(0.05) = 0.2236068.
    rate = clustered_rate(CONTROL)
    assert rate.rate == 0.5 and rate.chats == 5 and rate.votes == 10.0
    assert rate.se == pytest.approx(math.sqrt(0.05))
    # Effective votes r (1 - r) / var = 0.25 / 0.05 = 5 (half the 10 votes: chats agree
    # with themselves). Wilson with n = 5: z^2 / n = 3.841459 / 5 = 0.7682918,
    # centre = (0.5 + 0.3841459) / 1.7682918 = 0.5,
    # half = 1.959964 * sqrt(0.25 / 5 + 3.841459 / 100) / 1.7682918
    #      = 1.959964 * sqrt(0.0884146) / 1.7682918 = 1.959964 * 0.2973459 / 1.7682918
    #      = 0.3295764
    assert rate.effective_votes == pytest.approx(5.0)
    assert (rate.low, rate.high) == pytest.approx((0.5 - 0.3295764, 0.5 + 0.3295764), abs=1e-6)
    # Counting the votes as independent (Wilson on 5 of 10) would claim a narrower interval:
    # half = 1.959964 * sqrt(0.025 + 0.0096036) / 1.3841459 = 0.2634
    assert rate.high - rate.low > 2 * 0.26


def test_clustered_variance_matches_a_generic_cluster_sandwich() -> None:
    """The closed form against the textbook sandwich of an OLS fit of each vote on a constant,
    clustered by chat: (X'X)^-1 (sum_g X_g' e_g e_g' X_g) (X'X)^-1 * G / (G - 1), computed
    with matrices at the vote level (statsmodels' cov_type='cluster' is the same sandwich; it
    is not installed here)."""
    rng = np.random.default_rng(7)
    chats = []
    for _ in range(23):
        n = int(rng.integers(1, 12))
        chats.append((int(rng.binomial(n, rng.beta(2, 2))), n))
    y = np.concatenate([[1.0] * up + [0.0] * (n - up) for up, n in chats])
    g = np.concatenate([[i] * n for i, (_, n) in enumerate(chats)])
    x = np.ones((y.size, 1))
    bread = np.linalg.inv(x.T @ x)
    beta = bread @ x.T @ y
    e = y - x @ beta
    meat = np.zeros((1, 1))
    for i in range(len(chats)):
        score = x[g == i].T @ e[g == i]
        meat += np.outer(score, score)
    k = len(chats)
    cov = bread @ meat @ bread * k / (k - 1)
    rate = clustered_rate(chats)
    assert rate.rate == pytest.approx(float(beta[0]))
    assert rate.se == pytest.approx(math.sqrt(float(cov[0, 0])))


def test_lift_test_by_hand() -> None:
    # Variant: three chats (2, 2) and two (1, 2): 8 of 10.
    variant = [(2, 2), (2, 2), (1, 2), (2, 2), (1, 2)]
    # r_v = 8 / 10 = 0.8; residuals 0.4, 0.4, -0.6, 0.4, -0.6, squares sum 3 * .16 + 2 * .36 = 1.2;
    # CR1 5/4 * 1.2 / 100 = 0.015. Control (above): 0.05.
    # Floor: the pooled rate 13/20 = 0.65, 0.65 * 0.35 / 10 = 0.02275 per group: the
    # variant's 0.015 is raised to 0.02275 (chats never count for more than their votes).
    # var = 0.05 + 0.02275 = 0.07275, se = 0.2697221, lift = 0.3, z = 1.1122560,
    # p = 2 * (1 - Phi(1.1122560)) = 0.2660281, interval 0.3 +- 1.959964 * 0.2697221.
    test = chat_lift_test(CONTROL, variant)
    assert test.lift == pytest.approx(0.3)
    assert test.z == pytest.approx(0.3 / math.sqrt(0.07275))
    assert test.p_value == pytest.approx(0.2660281, abs=1e-6)
    half = Z * math.sqrt(0.07275)
    assert (test.low, test.high) == pytest.approx((0.3 - half, 0.3 + half))
    assert test.chats == (5, 5)
    # The vote-level test on the same 5/10 vs 8/10 gives a smaller p (0.17): it sees 20
    # independent trials where there are 10 chats.
    assert two_proportion_test(5, 10, 8, 10).p_value < test.p_value


def test_too_few_chats_give_no_interval_and_no_evidence() -> None:
    few = CONTROL[: MIN_CHATS - 1]
    rate = clustered_rate(few)
    assert rate.rate == pytest.approx(5 / 8) and math.isnan(rate.low) and math.isnan(rate.high)
    test = chat_lift_test(few, CONTROL)
    assert math.isnan(test.low) and test.p_value == 1.0 and test.z == 0.0
    seq = always_valid_lift(few, CONTROL)
    assert (seq.low, seq.high, seq.p_value) == (-1.0, 1.0, 1.0)
    assert seq.chats == (MIN_CHATS - 1, 5)
    empty = clustered_rate([])
    assert math.isnan(empty.rate) and math.isnan(empty.low) and empty.chats == 0
    assert math.isnan(always_valid_lift([], CONTROL).lift)
    # chats without votes do not count
    assert clustered_rate([*CONTROL, (0, 0), (0, 0)]).chats == 5


def test_always_valid_lift_by_hand() -> None:
    control = CONTROL + CONTROL  # 10 chats, 10 of 20, CR1 10/9 * 8 / 400 = 0.0222222
    variant = [(2, 2)] * 4 + [(1, 2)] + [(2, 2)] * 5  # 19 of 20
    # r_v = 0.95: residuals 0.1 (nine chats) and -0.9: squares 0.09 + 0.81 = 0.9,
    # CR1 10/9 * 0.9 / 400 = 0.0025, floored at pooled 29/40 = 0.725: 0.725 * 0.275 / 20
    # = 0.00996875. var = 0.0222222 + 0.0099688 = 0.0321910; lift = 0.45.
    var = 10 / 9 * 8 / 400 + 0.725 * 0.275 / 20
    # Tuned for 20 chats and reading at 20: s = c = -2 ln 0.05 + ln(1 - 2 ln 0.05)
    # = 5.9914645 + ln 6.9914645 = 5.9914645 + 1.9446901 = 7.9361546.
    c = 7.9361546
    assert DESIGN_ALPHA == 0.05
    # half = sqrt(var (1 + s) / s ln((1 + s) / 0.05^2))
    #      = sqrt(0.0321910 * 1.1260056 * ln 3574.4618) = sqrt(0.0321910 * 1.1260056 * 8.1815699)
    #      = sqrt(0.2965591) = 0.5445724
    half = math.sqrt(var * (1 + c) / c * math.log((1 + c) / 0.0025))
    assert half == pytest.approx(0.5445724, abs=1e-6)
    # p = sqrt(1 + s) exp(-lift^2 s / (2 var (1 + s)))
    #   = 2.9893402 * exp(-0.2025 * 7.9361546 / (2 * 0.0321910 * 8.9361546))
    #   = 2.9893402 * exp(-2.7933180) = 2.9893402 * 0.0612178 = 0.1830007
    seq = always_valid_lift(control, variant, planned_chats=20)
    assert seq.lift == pytest.approx(0.45)
    assert (seq.low, seq.high) == pytest.approx((0.45 - half, 0.45 + half), abs=1e-9)
    assert seq.p_value == pytest.approx(0.1830007, abs=1e-6)
    assert seq.chats == (10, 10)
    # The fixed-horizon test on the same data: z = 0.45 / sqrt(0.032191) = 2.508, p = 0.012:
    # "significant" once, but the always-valid one, which may be watched, is not yet.
    assert chat_lift_test(control, variant).p_value == pytest.approx(0.0121381, abs=1e-6)
    # The bound is wider than the fixed one, narrower when tuned for the sample at hand.
    wide = always_valid_lift(control, variant, planned_chats=2000)
    assert wide.high - wide.low > seq.high - seq.low
    # p < 0.05 exactly when the bound excludes 0, at any level.
    for level in (0.1, 0.2, 0.3):
        at = always_valid_lift(control, variant, level, planned_chats=20)
        assert (at.low > 0) == (seq.p_value < level)


def _simulate_null(seed: int, experiments: int) -> tuple[float, float, float]:
    """A/A experiments watched after every batch: chats arrive in batches, each with its own
    👍 propensity (Beta(1, 1)) and 20 votes; stop at the first "significant" reading. Returns
    the false-positive rates of the always-valid p, the vote-level z-test and the chat-level
    fixed-horizon test read at the end only."""
    rng = np.random.default_rng(seed)
    batches, per_batch, votes = 10, 4, 20
    av = vote = fixed = 0
    for _ in range(experiments):
        groups: list[list[tuple[float, float]]] = [[], []]
        av_hit = vote_hit = False
        for _ in range(batches):
            for group in groups:
                for p in rng.beta(1.0, 1.0, size=per_batch):
                    group.append((float(rng.binomial(votes, p)), float(votes)))
            a, b = groups
            av_hit |= always_valid_lift(a, b, planned_chats=2 * batches * per_batch).p_value < 0.05
            ups = [int(sum(u for u, _ in g)) for g in groups]
            ns = [int(sum(n for _, n in g)) for g in groups]
            vote_hit |= two_proportion_test(ups[0], ns[0], ups[1], ns[1]).p_value < 0.05
        av += av_hit
        vote += vote_hit
        fixed += chat_lift_test(*groups).p_value < 0.05
    return av / experiments, vote / experiments, fixed / experiments


def test_always_valid_keeps_false_positives_under_peeking_and_the_vote_test_does_not() -> None:
    av, vote, fixed = _simulate_null(seed=34, experiments=300)
    # 300 experiments: a true 5% rate gives at most ~9% here (binomial 99.9th percentile).
    assert av <= 0.08, av
    # Votes as independent trials, watched after every batch: most A/A tests "win".
    assert vote >= 0.4, vote
    # The chat-level fixed-horizon test read once at the end is near its nominal 5%.
    assert fixed <= 0.1, fixed


def test_ipw_rate_is_the_chat_level_rate_with_weights() -> None:
    # One probability for every chat: the plain chat-level rate and interval.
    plain = clustered_rate(CONTROL)
    ipw = ipw_rate([(up, n - up, 0.5) for up, n in CONTROL])
    assert (ipw.rate, ipw.low, ipw.high) == pytest.approx((plain.rate, plain.low, plain.high))
    assert ipw.chats == 5 and ipw.effective_chats == pytest.approx(5.0)
    assert math.isnan(ipw_rate([(1, 1, 0.5)]).low)  # one chat: too few for an interval


def test_ipw_rate_by_hand() -> None:
    # (up, down, probability): weights w = 1/p = 2, 2, 4, 2, 1.
    chats = [(2, 0, 0.5), (0, 2, 0.5), (1, 1, 0.25), (2, 0, 0.5), (0, 2, 1.0)]
    # sum w up = 4 + 0 + 4 + 4 + 0 = 12, sum w votes = 4 + 4 + 8 + 4 + 2 = 22, r = 6/11.
    # w (up - r votes) with r votes = 12/11: 2 * 10/11, 2 * -12/11, 4 * -1/11, 2 * 10/11,
    # 1 * -12/11; squares (400 + 576 + 16 + 400 + 144) / 121 = 1536/121.
    # CR1: 5/4 * (1536/121) / 22^2 = 1920/58564 = 0.0327846.
    # n_eff = r (1 - r) / var = (30/121) / (1920/58564) = 7.5625 (< 10 votes).
    # Wilson(6/11, 7.5625): z^2 / n = 0.5079615, centre = (0.5454545 + 0.2539807) / 1.5079615
    # = 0.5301430; half = 1.959964 * sqrt(0.2479339 / 7.5625 + 3.841459 / 228.765625)
    # / 1.5079615 = 1.959964 * sqrt(0.0327846 + 0.0167921) / 1.5079615 = 0.2893989
    rate = ipw_rate(chats)
    assert rate.rate == pytest.approx(6 / 11)
    assert (rate.low, rate.high) == pytest.approx((0.5301430 - 0.2893989, 0.5301430 + 0.2893989))
    # effective chats (sum w)^2 / sum w^2 = 11^2 / 29
    assert rate.chats == 5 and rate.effective_chats == pytest.approx(121 / 29)


@pytest.mark.parametrize(
    "chats",
    [
        [[1.0]] * 5,
        [[5.0]] * 5,
        [[5.0, 5.0, 5.0]] * 6,
        [[1.0], [1.0], [1.0], [1.0], [5.0]],
        [[5.0], [5.0], [5.0], [5.0], [1.0]],
        [[1.0, 5.0]] * 5,
        [[4.0, 5.0], [3.0], [5.0], [2.0], [5.0]],
        [[1.0]] * 200 + [[2.0]],
    ],
)
def test_rating_interval_stays_on_the_scale(chats: list[list[float]]) -> None:
    result = rating_interval(chats)
    assert 1.0 <= result.low <= result.mean <= result.high <= 5.0
    assert result.n == sum(len(c) for c in chats)
    assert result.high > result.low  # never a point: all 5s still leave room below


def test_rating_interval_all_fives_and_all_ones_by_hand() -> None:
    # All 5s: x = 1 for five chats; the sandwich is 0, so n_eff = the 5 ratings, Wilson(1, 5):
    # centre = (1 + 0.3841459) / 1.7682918 = 0.7827 , half = 1.959964 * sqrt(0.0384146)
    # / 1.7682918 = 0.2172646; low = 0.5654, on the scale 1 + 4 * 0.5654 = 3.2620701.
    fives = rating_interval([[5.0]] * 5)
    assert (fives.mean, fives.high) == (5.0, 5.0)
    assert fives.low == pytest.approx(3.2620701, abs=1e-6)
    ones = rating_interval([[1.0]] * 5)
    assert (ones.mean, ones.low) == (1.0, 1.0)
    assert ones.high == pytest.approx(6.0 - 3.2620701, abs=1e-6)  # the mirror image


@pytest.mark.parametrize("n", [1, 2, MIN_CHATS - 1])
def test_rating_interval_with_too_few_chats_is_not_a_number(n: int) -> None:
    result = rating_interval([[1.0], [5.0], [3.0], [4.0]][:n])
    assert math.isnan(result.low) and math.isnan(result.high) and 1.0 <= result.mean <= 5.0
    # the old t-interval gave -15.56..22.56 for two ratings of 1 and 5


def test_rating_interval_rejects_ratings_off_the_scale() -> None:
    with pytest.raises(ValueError, match="outside the scale"):
        rating_interval([[0.0]])
