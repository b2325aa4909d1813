"""The Thompson split against hand-computed cases, and the allocator's cache and floor."""

from __future__ import annotations

import math

import pytest
import scipy.integrate  # type: ignore[import-untyped]
import scipy.stats  # type: ignore[import-untyped]

from bot.engine.bandit import Allocator, prob_best, thompson_split, weight_split
from bot.engine.variants import Experiment, Variant


def p_b_beats_a(a1: int, b1: int, a2: int, b2: int) -> float:
    """P(X2 > X1) for X1 ~ Beta(a1, b1), X2 ~ Beta(a2, b2), integer a2: the closed form
    sum_{i < a2} B(a1 + i, b1 + b2) / ((b2 + i) B(1 + i, b2) B(a1, b1)) (Evan Miller)."""

    def lbeta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    return sum(
        math.exp(lbeta(a1 + i, b1 + b2) - math.log(b2 + i) - lbeta(1 + i, b2) - lbeta(a1, b1))
        for i in range(a2)
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [((10, 5), (12, 4)), ((0, 0), (0, 0)), ((3, 7), (30, 70)), ((400, 100), (380, 120))],
)
def test_two_variants_match_the_closed_form(a: tuple[int, int], b: tuple[int, int]) -> None:
    best = prob_best({"a": a, "b": b})
    want = p_b_beats_a(1 + a[0], 1 + a[1], 1 + b[0], 1 + b[1])
    assert best["b"] == pytest.approx(want, abs=1e-6)
    assert best["a"] + best["b"] == pytest.approx(1.0)


def test_the_hand_computed_case_with_the_floor() -> None:
    # a: 10 up 5 down -> Beta(11, 6); b: 12 up 4 down -> Beta(13, 5). The closed form gives
    # P(b best) = 0.68895...; the floor 0.1 over 2 variants: p = 0.1 + 0.8 * P(best).
    want_b = p_b_beats_a(11, 6, 13, 5)
    assert want_b == pytest.approx(0.688950, abs=1e-6)
    split = thompson_split({"a": (10, 5), "b": (12, 4)}, floor=0.1)
    assert split["b"] == pytest.approx(0.1 + 0.8 * want_b, abs=1e-6)  # 0.65116
    assert split["a"] == pytest.approx(0.1 + 0.8 * (1 - want_b), abs=1e-6)  # 0.34884
    # A variant far behind keeps its floor, never less.
    lopsided = thompson_split({"a": (300, 10), "b": (10, 300)}, floor=0.1)
    assert lopsided["b"] == pytest.approx(0.1, abs=1e-9) and lopsided["b"] >= 0.1
    assert sum(lopsided.values()) == pytest.approx(1.0)


def test_three_variants_match_an_independent_integration() -> None:
    counts = {"a": (20, 10), "b": (25, 10), "c": (5, 2)}
    params = {k: (1 + up, 1 + down) for k, (up, down) in counts.items()}

    def best(name: str) -> float:
        others = [v for k, v in params.items() if k != name]

        def integrand(x: float) -> float:
            out = float(scipy.stats.beta.pdf(x, *params[name]))
            for a, b in others:
                out *= float(scipy.stats.beta.cdf(x, a, b))
            return out

        return float(scipy.integrate.quad(integrand, 0, 1, limit=200)[0])

    got = prob_best(counts)
    for name in counts:
        assert got[name] == pytest.approx(best(name), abs=1e-5)
    # The floor: min(0.1, 1/3) each, and 1 - 3 * 0.1 = 0.7 of the mass by P(best).
    split = thompson_split(counts)
    for name in counts:
        assert split[name] == pytest.approx(0.1 + 0.7 * best(name), abs=1e-5)


def test_weights_split_by_share_and_skip_zero() -> None:
    assert weight_split({"a": 1, "b": 3, "c": 0}) == {"a": 0.25, "b": 0.75}
    with pytest.raises(ValueError, match="no variant has a weight"):
        weight_split({"a": 0})


def _experiment(allocation: str, version: int = 1) -> Experiment:
    return Experiment(
        "e",
        (Variant("a", "m", 1.0, True), Variant("b", "m", 2.0), Variant("c", "m", 0.0)),
        allocation,
        version,
    )


async def test_the_allocator_caches_skips_weight_0_and_follows_changes() -> None:
    calls: list[list[str]] = []
    votes = {"a": (10, 5), "b": (12, 4), "c": (100, 0)}

    async def count(names: object) -> dict[str, tuple[int, int]]:
        calls.append(list(names))  # type: ignore[call-overload]
        return {n: votes[n] for n in calls[-1]}

    now = [0.0]
    allocator = Allocator(count, refresh_s=300.0, clock=lambda: now[0])
    # weights: the shares; no votes read
    assert await allocator.split(_experiment("weights"), ["a", "b", "c"]) == {
        "a": pytest.approx(1 / 3),
        "b": pytest.approx(2 / 3),
    }
    assert calls == []
    thompson = _experiment("thompson")
    first = await allocator.split(thompson, ["a", "b", "c"])
    assert set(first) == {"a", "b"}  # c has weight 0: no new chats, whatever its votes
    assert first["b"] == pytest.approx(0.1 + 0.8 * p_b_beats_a(11, 6, 13, 5), abs=1e-6)
    votes["a"] = (100, 0)
    now[0] = 299.0
    assert await allocator.split(thompson, ["a", "b", "c"]) == first  # cached
    now[0] = 301.0
    later = await allocator.split(thompson, ["a", "b", "c"])
    assert later["a"] > 0.85 and len(calls) == 2  # recomputed after refresh_s
    # A change of the variants (a new version) recomputes at once; only ready ones count.
    assert await allocator.split(_experiment("thompson", 2), ["b"]) == {"b": 1.0}
    assert len(calls) == 3
