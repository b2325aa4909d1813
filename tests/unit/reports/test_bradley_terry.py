"""Bradley-Terry strengths and their bootstrap intervals (bot/reports/bradley_terry.py), checked
against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from bot.reports.bradley_terry import BtEstimate, bradley_terry, bradley_terry_bootstrap

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
