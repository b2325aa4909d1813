"""The statistics that compare model variants (bot/reports/variant_stats.py), checked against values
worked out by hand (the arithmetic is in the comments), not against the same formulas."""

from __future__ import annotations

import math

import pytest

from bot.reports.variant_stats import (
    FIXED_SAMPLE_NOTE,
    MeanInterval,
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
