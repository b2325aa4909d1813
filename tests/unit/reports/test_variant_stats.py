"""The statistics that compare model variants (bot/reports/variant_stats.py), checked against values
worked out by hand (the arithmetic is in the comments), not against the same formulas."""

from __future__ import annotations

import math

import pytest

from bot.reports.variant_stats import (
    FIXED_SAMPLE_NOTE,
    BtEstimate,
    MeanInterval,
    bradley_terry,
    bradley_terry_bootstrap,
    latency_percentiles,
    mean_interval,
    sample_ratio_mismatch,
    two_proportion_test,
    wilson_interval,
)

# --- Wilson ----------------------------------------------------------------------------------


def test_wilson_eight_of_ten() -> None:
    # z^2 = 3.841459, z^2/n = 0.3841459, denominator 1 + 0.3841459 = 1.3841459
    # centre = (0.8 + 0.1920729) / 1.3841459 = 0.716738
    # half = 1.959964 * sqrt(0.8*0.2/10 + 3.841459/400) / 1.3841459
    #      = 1.959964 * sqrt(0.016 + 0.0096036) / 1.3841459 = 1.959964 * 0.160011 / 1.3841459
    #      = 0.226577  ->  (0.490162, 0.943316)
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_at_the_extremes_stays_inside_zero_one() -> None:
    # 0 of 10: centre = half, so low = 0 and high = 2 * centre = (z^2/n) / (1 + z^2/n)
    #   = 0.3841459 / 1.3841459 = 0.277533; 10 of 10 mirrors it: low = 1 - 0.277533 = 0.722467
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)


def test_wilson_without_trials_is_the_whole_unit_interval() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(-1, 10)


# --- two proportions -------------------------------------------------------------------------


def test_two_proportion_45_of_100_against_60_of_100() -> None:
    # pooled p = 105/200 = 0.525; se = sqrt(0.525 * 0.475 * (1/100 + 1/100))
    #   = sqrt(0.249375 * 0.02) = sqrt(0.0049875) = 0.0706222
    # z = (0.60 - 0.45) / 0.0706222 = 2.12398
    # p = 2 * (1 - Phi(2.12398)) = erfc(2.12398 / sqrt 2) = 0.03367
    result = two_proportion_test(45, 100, 60, 100)
    assert result.difference == pytest.approx(0.15, abs=1e-12)
    assert result.z == pytest.approx(2.1240, abs=1e-4)
    assert result.p_value == pytest.approx(0.0337, abs=1e-4)


def test_two_proportion_is_signed_variant_minus_control() -> None:
    # swapping the groups flips the sign of difference and z but not the two-sided p
    result = two_proportion_test(60, 100, 45, 100)
    assert result.difference == pytest.approx(-0.15, abs=1e-12)
    assert result.z == pytest.approx(-2.1240, abs=1e-4)
    assert result.p_value == pytest.approx(0.0337, abs=1e-4)


def test_two_proportion_equal_rates_give_no_evidence() -> None:
    # 30/100 and 30/100: difference 0, so z = 0 and p = 2 * (1 - Phi(0)) = 1
    result = two_proportion_test(30, 100, 30, 100)
    assert result.z == 0.0
    assert result.p_value == pytest.approx(1.0)


def test_two_proportion_degenerate_inputs() -> None:
    empty = two_proportion_test(0, 0, 5, 10)
    assert (empty.z, empty.p_value) == (0.0, 1.0)
    assert math.isnan(empty.difference)
    none_converted = two_proportion_test(0, 10, 0, 20)  # pooled p = 0
    assert none_converted == type(none_converted)(difference=0.0, z=0.0, p_value=1.0)
    all_converted = two_proportion_test(10, 10, 20, 20)  # pooled p = 1
    assert (all_converted.difference, all_converted.z, all_converted.p_value) == (0.0, 0.0, 1.0)


def test_fixed_sample_note_warns_about_peeking() -> None:
    assert "fixed in advance" in FIXED_SAMPLE_NOTE
    assert "peeking" in FIXED_SAMPLE_NOTE
    assert two_proportion_test.__doc__ is not None
    assert "FIXED_SAMPLE_NOTE" in two_proportion_test.__doc__


# --- means and latency -----------------------------------------------------------------------


def test_mean_interval_of_one_to_five() -> None:
    # mean 3; sample variance (4+1+0+1+4)/4 = 2.5; se = sqrt(2.5/5) = 0.7071068
    # t(0.975, 4 dof) = 2.776445 (table); half = 2.776445 * 0.7071068 = 1.963243
    result = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result.n == 5
    assert result.mean == pytest.approx(3.0)
    assert result.low == pytest.approx(1.036757, abs=1e-5)
    assert result.high == pytest.approx(4.963243, abs=1e-5)


def test_mean_interval_at_90_percent_is_narrower() -> None:
    # t(0.95, 4 dof) = 2.131847 (table); half = 2.131847 * 0.7071068 = 1.507443
    result = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0], confidence=0.90)
    assert result.low == pytest.approx(1.492557, abs=1e-5)
    assert result.high == pytest.approx(4.507443, abs=1e-5)


def test_mean_interval_with_too_few_values() -> None:
    empty = mean_interval([])
    assert empty.n == 0
    assert math.isnan(empty.mean) and math.isnan(empty.low) and math.isnan(empty.high)
    single = mean_interval([4.5])
    assert (single.mean, single.n) == (4.5, 1)
    assert math.isnan(single.low) and math.isnan(single.high)
    assert isinstance(single, MeanInterval)


def test_latency_percentiles_interpolate_linearly() -> None:
    # sorted 1..10; p50 sits at rank 0.50 * 9 = 4.5, halfway between 5 and 6 -> 5.5
    # p95 sits at rank 0.95 * 9 = 8.55, between 9 and 10 -> 9 + 0.55 = 9.55
    p50, p95 = latency_percentiles([10.0, 3.0, 1.0, 7.0, 2.0, 9.0, 4.0, 6.0, 8.0, 5.0])
    assert p50 == pytest.approx(5.5)
    assert p95 == pytest.approx(9.55)


def test_latency_percentiles_of_nothing_are_nan() -> None:
    p50, p95 = latency_percentiles([])
    assert math.isnan(p50) and math.isnan(p95)


# --- sample ratio mismatch -------------------------------------------------------------------


def test_srm_on_an_even_split_within_noise() -> None:
    # expected 500 each: chi2 = (20^2 + 20^2) / 500 = 1.6 with 1 dof
    # p = P(chi2_1 > 1.6) = erfc(sqrt(1.6 / 2)) = erfc(0.894427) = 0.2059
    result = sample_ratio_mismatch({"a": 520, "b": 480}, {"a": 1.0, "b": 1.0})
    assert result.chi2 == pytest.approx(1.6)
    assert result.dof == 1
    assert result.p_value == pytest.approx(0.2059, abs=1e-4)
    assert result.warn is False


def test_srm_warns_on_a_clear_mismatch() -> None:
    # chi2 = (100^2 + 100^2) / 500 = 40; p = erfc(sqrt(20)) = 2.5e-10
    result = sample_ratio_mismatch({"a": 600, "b": 400}, {"a": 1.0, "b": 1.0})
    assert result.chi2 == pytest.approx(40.0)
    assert result.p_value < 1e-9
    assert result.warn is True


def test_srm_uses_the_weights_for_expected_counts() -> None:
    # weights 1:3 of 1000 -> expected 250 and 750; exactly on target -> chi2 0, p 1
    on_target = sample_ratio_mismatch({"a": 250, "b": 750}, {"a": 1.0, "b": 3.0})
    assert on_target.chi2 == pytest.approx(0.0)
    assert on_target.p_value == pytest.approx(1.0)
    assert on_target.warn is False
    # 300/700 against 250/750: chi2 = 50^2/250 + 50^2/750 = 10 + 3.3333 = 13.3333
    # p = erfc(sqrt(13.3333 / 2)) = erfc(2.58199) = 2.6e-4 < 0.01 -> warn
    off = sample_ratio_mismatch({"a": 300, "b": 700}, {"a": 1.0, "b": 3.0})
    assert off.chi2 == pytest.approx(13.33333, abs=1e-4)
    assert off.p_value == pytest.approx(2.6e-4, abs=0.1e-4)
    assert off.warn is True


def test_srm_three_variants_two_degrees_of_freedom() -> None:
    # expected 100 each: chi2 = (10^2 + 0 + 10^2) / 100 = 2; with 2 dof the chi-square
    # survival function is exp(-x/2), so p = exp(-1) = 0.367879
    result = sample_ratio_mismatch({"a": 110, "b": 100, "c": 90}, {"a": 1, "b": 1, "c": 1})
    assert result.dof == 2
    assert result.chi2 == pytest.approx(2.0)
    assert result.p_value == pytest.approx(0.367879, abs=1e-6)


def test_srm_ignores_variants_without_weight() -> None:
    # c has weight 0, so only a and b enter: the 520/480 case again, chi2 = 1.6
    result = sample_ratio_mismatch({"a": 520, "b": 480, "c": 999}, {"a": 1, "b": 1, "c": 0})
    assert result.chi2 == pytest.approx(1.6)
    assert result.dof == 1


def test_srm_counts_a_missing_variant_as_zero() -> None:
    # b never assigned: expected 50/50 of 100 -> chi2 = (50^2 + 50^2) / 50 = 100
    result = sample_ratio_mismatch({"a": 100}, {"a": 1.0, "b": 1.0})
    assert result.chi2 == pytest.approx(100.0)
    assert result.warn is True


def test_srm_with_nothing_to_compare() -> None:
    single = sample_ratio_mismatch({"a": 700, "b": 300}, {"a": 1.0, "b": 0.0})
    assert (single.p_value, single.warn) == (1.0, False)
    nobody = sample_ratio_mismatch({"a": 0, "b": 0}, {"a": 1.0, "b": 1.0})
    assert (nobody.p_value, nobody.warn) == (1.0, False)
    no_weights = sample_ratio_mismatch({"a": 5}, {})
    assert (no_weights.p_value, no_weights.warn) == (1.0, False)


# --- Bradley-Terry ---------------------------------------------------------------------------

A_THREE_B_ONE = [("A", "B", 1.0), ("A", "B", 1.0), ("B", "A", 0.0), ("A", "B", 0.0)]


def test_bt_two_players_mle_is_the_win_ratio() -> None:
    # two players: the likelihood equation W_A = n * s_A / (s_A + s_B) gives s_A / s_B = 3/1;
    # with geometric mean 1: s_A = sqrt(3) = 1.7320508, s_B = 1/sqrt(3) = 0.5773503
    strengths = bradley_terry(A_THREE_B_ONE, prior=0.0)
    assert strengths["A"] == pytest.approx(1.7320508, rel=1e-6)
    assert strengths["B"] == pytest.approx(0.5773503, rel=1e-6)


def test_bt_ties_count_half_a_win() -> None:
    # A: 1 + 1 + 0.5 + 0 = 2.5 wins of 4, B: 1.5; two players -> s_A / s_B = 2.5 / 1.5 = 5/3
    matches = [("A", "B", 1.0), ("B", "A", 0.0), ("A", "B", 0.5), ("A", "B", 0.0)]
    strengths = bradley_terry(matches, prior=0.0)
    assert strengths["A"] / strengths["B"] == pytest.approx(5 / 3, rel=1e-6)
    assert strengths["A"] * strengths["B"] == pytest.approx(1.0, rel=1e-9)


def test_bt_default_prior_shrinks_toward_equal() -> None:
    # the virtual ties pull the ratio from the MLE's 3 toward 1, but keep the order
    strengths = bradley_terry(A_THREE_B_ONE)
    assert 1.5 < strengths["A"] / strengths["B"] < 3.0
    assert strengths["A"] * strengths["B"] == pytest.approx(1.0, rel=1e-9)


def test_bt_three_player_cycle_is_a_draw() -> None:
    # A > B > C > A once each: the table is symmetric under rotation, so all strengths are
    # equal, and with geometric mean 1 each is 1
    cycle = [("A", "B", 1.0), ("B", "C", 1.0), ("C", "A", 1.0)]
    for prior in (0.0, 1.0):
        assert bradley_terry(cycle, prior=prior) == pytest.approx({"A": 1.0, "B": 1.0, "C": 1.0})


def test_bt_three_player_transitive_table() -> None:
    # A beats B 2-1, B beats C 2-1, A beats C 2-1. Swapping A with C and every result maps the
    # table to itself, so s_A * s_C = 1 and (geometric mean 1) s_B = 1. With s_A = x,
    # s_C = 1/x, A's likelihood equation (4 wins of 6) reads 3x/(x+1) + 3x^2/(x^2+1) = 4.
    table = (
        [("A", "B", 1.0)] * 2
        + [("A", "B", 0.0)]
        + [("B", "C", 1.0)] * 2
        + [("B", "C", 0.0)]
        + [("C", "A", 0.0)] * 2
        + [("C", "A", 1.0)]
    )
    strengths = bradley_terry(table, prior=0.0)
    assert strengths["A"] > strengths["B"] > strengths["C"]
    assert strengths["B"] == pytest.approx(1.0, rel=1e-6)
    assert strengths["A"] * strengths["C"] == pytest.approx(1.0, rel=1e-6)
    x = strengths["A"]
    assert 3 * x / (x + 1) + 3 * x * x / (x * x + 1) == pytest.approx(4.0, rel=1e-6)
    # x = 1.5971 solves it: 3*1.5971/2.5971 + 3*2.55073/3.55073 = 1.84486 + 2.15511 = 4.0000
    assert x == pytest.approx(1.5971, abs=1e-4)
    shrunk = bradley_terry(table)
    assert shrunk["A"] > shrunk["B"] > shrunk["C"]
    assert shrunk["A"] < strengths["A"] and shrunk["C"] > strengths["C"]


def test_bt_a_player_without_wins_stays_finite_with_the_prior() -> None:
    losses = [("A", "B", 1.0)] * 5
    strengths = bradley_terry(losses)
    assert 0.0 < strengths["B"] < 1.0 < strengths["A"] < math.inf
    with pytest.raises(ValueError, match="do not exist"):
        bradley_terry(losses, prior=0.0)


def test_bt_without_matches_and_bad_matches() -> None:
    assert bradley_terry([]) == {}
    assert bradley_terry_bootstrap([]) == {}
    with pytest.raises(ValueError):
        bradley_terry([("A", "A", 1.0)])
    with pytest.raises(ValueError):
        bradley_terry([("A", "B", 2.0)])


def test_bt_bootstrap_interval_brackets_the_estimate_and_is_seeded() -> None:
    matches = [("A", "B", 1.0)] * 8 + [("A", "B", 0.0)] * 2 + [("B", "C", 1.0)] * 6
    matches += [("B", "C", 0.0)] * 4 + [("A", "C", 1.0)] * 7 + [("A", "C", 0.5)] * 3
    result = bradley_terry_bootstrap(matches, rounds=100, seed=7)
    point = bradley_terry(matches)
    assert set(result) == {"A", "B", "C"}
    for name, estimate in result.items():
        assert isinstance(estimate, BtEstimate)
        assert estimate.strength == pytest.approx(point[name])
        assert estimate.low < estimate.strength < estimate.high
    assert result["A"].low > result["C"].low
    assert bradley_terry_bootstrap(matches, rounds=100, seed=7) == result
    assert bradley_terry_bootstrap(matches, rounds=100, seed=8) != result


def test_bt_bootstrap_wider_at_higher_confidence() -> None:
    matches = [("A", "B", 1.0)] * 6 + [("A", "B", 0.0)] * 4
    narrow = bradley_terry_bootstrap(matches, rounds=100, seed=1, confidence=0.5)
    wide = bradley_terry_bootstrap(matches, rounds=100, seed=1, confidence=0.95)
    assert wide["A"].low <= narrow["A"].low
    assert wide["A"].high >= narrow["A"].high
    assert wide["A"].high - wide["A"].low > narrow["A"].high - narrow["A"].low


def test_bt_bootstrap_needs_a_prior() -> None:
    with pytest.raises(ValueError):
        bradley_terry_bootstrap(A_THREE_B_ONE, prior=0.0)
