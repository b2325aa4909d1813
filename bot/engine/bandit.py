"""How new chats are split between the variants: fixed weights, or a Thompson bandit.

`allocation = "weights"` (the default): each variant with a weight above 0 gets its weight's
share of new chats. `allocation = "thompson"`: each variant's 👍 rate has the posterior
Beta(1 + 👍, 1 + 👎) (a uniform prior, every vote on its replies), and a new chat goes to
variant i with probability

    p_i = f + (1 - k f) * P(variant i has the highest 👍 rate)

over the k variants with a weight above 0 (weight 0 still means "no new chats"), where
f = min(FLOOR, 1/k) is the floor that keeps every variant learning. Drawing a variant with
probability P(best) is exactly what Thompson sampling does one posterior draw at a time; having
the probabilities instead lets the draw come from the chat's hash (so a retried first turn gets
the same variant) and lets the assignment record the probability it was made with, which the
report's inverse-propensity estimates need. Mixing in the floor (rather than clipping and
renormalising, which can push a clipped share back under the floor) keeps every p_i >= f.

P(best) is computed by numerical integration, P_i = integral of f_i(x) * prod_{j != i} F_j(x)
over [0, 1], on a grid that follows each posterior's bulk: deterministic, no random numbers,
and accurate to about 1e-6 (tests compare with the closed form for two variants). The split is
recomputed at most every REFRESH_S per replica, and at once when the variants change.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

import numpy as np

from bot.engine.variants import Experiment

FLOOR = 0.1
REFRESH_S = 300.0
GRID = 2001  # points per posterior's bulk


def weight_split(weights: Mapping[str, float]) -> dict[str, float]:
    """Each positive weight's share of the total, in the given order."""
    live = {name: w for name, w in weights.items() if w > 0}
    total = sum(live.values())
    if total <= 0:
        raise ValueError("no variant has a weight above 0")
    return {name: w / total for name, w in live.items()}


def prob_best(counts: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """P(each variant's 👍 rate is the highest) under Beta(1 + up, 1 + down) posteriors."""
    import scipy.stats  # type: ignore[import-untyped]

    names = list(counts)
    if len(names) == 1:
        return {names[0]: 1.0}
    params = [(1.0 + up, 1.0 + down) for up, down in counts.values()]
    # One grid over [0, 1], dense wherever any posterior has its mass (1e-12..1-1e-12).
    pieces = [np.linspace(0.0, 1.0, GRID)]
    for a, b in params:
        low, high = scipy.stats.beta.ppf([1e-12, 1.0 - 1e-12], a, b)
        pieces.append(np.linspace(low, high, GRID))
    x = np.unique(np.concatenate(pieces))
    pdfs = np.array([scipy.stats.beta.pdf(x, a, b) for a, b in params])
    cdfs = np.array([scipy.stats.beta.cdf(x, a, b) for a, b in params])
    out: dict[str, float] = {}
    for i, name in enumerate(names):
        others = np.prod(np.delete(cdfs, i, axis=0), axis=0)
        out[name] = float(np.trapezoid(pdfs[i] * others, x))
    total = sum(out.values())
    return {name: p / total for name, p in out.items()}


def thompson_split(counts: Mapping[str, tuple[int, int]], floor: float = FLOOR) -> dict[str, float]:
    """The bandit's split: P(best) with the floor mixed in (see the module docstring)."""
    if not counts:
        raise ValueError("no variant to split between")
    k = len(counts)
    f = min(floor, 1.0 / k)
    best = prob_best(counts)
    return {name: f + (1.0 - k * f) * best[name] for name in counts}


CountVotes = Callable[[Sequence[str]], Awaitable[dict[str, tuple[int, int]]]]


@dataclass(eq=False, repr=False)
class Allocator:
    """The split new chats are drawn from, for one replica: the weights' shares, or the
    Thompson split cached for `refresh_s` (and recomputed when the variants change)."""

    count_votes: CountVotes
    _: KW_ONLY
    refresh_s: float = REFRESH_S
    floor: float = FLOOR
    clock: Callable[[], float] = time.monotonic
    _cached: tuple[object, float, dict[str, float]] | None = field(init=False, default=None)

    async def split(self, experiment: Experiment, ready: Sequence[str]) -> dict[str, float]:
        """variant -> probability for a new chat, over the `ready` variants (those this
        replica serves now) with a weight above 0, in the experiment's order."""
        weights = {
            v.name: v.weight for v in experiment.variants if v.name in ready and v.weight > 0
        }
        if not weights:
            raise ValueError("no variant with a weight above 0 is ready")
        if experiment.allocation != "thompson":
            return weight_split(weights)
        key = (experiment.name, experiment.version, tuple(weights))
        now = self.clock()
        cached = self._cached
        if cached is not None and cached[0] == key and now - cached[1] < self.refresh_s:
            return cached[2]
        counts = await self.count_votes(list(weights))
        # scipy and the integration stay off the event loop (a few ms; the first import ~0.5 s)
        split = await asyncio.to_thread(
            thompson_split, {name: counts.get(name, (0, 0)) for name in weights}, self.floor
        )
        if not all(math.isfinite(p) for p in split.values()):
            split = weight_split(weights)  # cannot happen with finite counts; never NaN shares
        self._cached = (key, now, split)
        return split
