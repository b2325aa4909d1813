"""Bradley-Terry strengths (with bootstrap percentile intervals) from pairwise judgements: the
arena's ranking of the variants in `admin variants`. No I/O and no state: every function maps
numbers to numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: Default weight of the Bradley-Terry prior: one virtual tie of every player against a
#: reference player of strength 1.
BT_PRIOR = 1.0

_FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BtEstimate:
    """A Bradley-Terry strength (geometric mean 1 across players) with a bootstrap percentile
    interval [low, high]."""

    strength: float
    low: float
    high: float


def _players(matches: Sequence[tuple[str, str, float]]) -> list[str]:
    """The players of `matches` in order of first appearance, after checking each match."""
    seen: dict[str, None] = {}
    for a, b, score in matches:
        if a == b:
            raise ValueError(f"a player cannot meet itself: {a!r}")
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"score of {a!r} against {b!r} must lie in [0, 1], got {score}")
        seen.setdefault(a, None)
        seen.setdefault(b, None)
    return list(seen)


def _tables(
    matches: Sequence[tuple[str, str, float]], index: Mapping[str, int]
) -> tuple[_FloatArray, _FloatArray]:
    """Games between each pair (symmetric matrix) and each player's wins (ties count half)."""
    k = len(index)
    games = np.zeros((k, k), dtype=np.float64)
    wins = np.zeros((k, k), dtype=np.float64)
    for a, b, score in matches:
        i, j = index[a], index[b]
        games[i, j] += 1.0
        games[j, i] += 1.0
        wins[i, j] += score
        wins[j, i] += 1.0 - score
    return games, wins


def _strongly_connected(wins: _FloatArray) -> bool:
    """Whether every player reaches every other along "scored something against" edges, the
    condition (Hunter 2004, assumption 1) for the unregularised MLE to exist."""
    k = wins.shape[0]
    edges = wins > 0.0
    for adjacency in (edges, edges.T):
        reached = {0}
        frontier = [0]
        while frontier:
            i = frontier.pop()
            for j in np.flatnonzero(adjacency[i]):
                if int(j) not in reached:
                    reached.add(int(j))
                    frontier.append(int(j))
        if len(reached) < k:
            return False
    return True


def _fit(
    games: _FloatArray, wins: _FloatArray, *, prior: float, iterations: int, tol: float
) -> _FloatArray:
    """MM iterations (Hunter 2004) for the strengths; geometric mean 1 on return.

    With `prior > 0` each player also plays `prior` virtual games against a fixed reference of
    strength 1 and wins half of them, which anchors the scale; with `prior == 0` the scale is
    free and is pinned by renormalising each step.
    """
    k = games.shape[0]
    total_wins = wins.sum(axis=1) + prior / 2.0
    strengths = np.ones(k, dtype=np.float64)
    for _ in range(iterations):
        pair_sums = strengths[:, None] + strengths[None, :]
        denominator = (games / pair_sums).sum(axis=1) + prior / (strengths + 1.0)
        updated = total_wins / denominator
        if prior == 0.0:
            updated /= math.exp(float(np.log(updated).mean()))
        change = float(np.max(np.abs(np.log(updated) - np.log(strengths))))
        strengths = updated
        if change < tol:
            break
    result: _FloatArray = strengths / math.exp(float(np.log(strengths).mean()))
    return result


def bradley_terry(
    matches: Sequence[tuple[str, str, float]],
    *,
    iterations: int = 1000,
    tol: float = 1e-10,
    prior: float = BT_PRIOR,
) -> dict[str, float]:
    """Bradley-Terry strengths from pairwise judgements, P(a beats b) = s_a / (s_a + s_b).

    Each match is `(a, b, score_of_a)`: 1 when a won, 0 when b won, 0.5 for a tie (half a win
    to each; any score in [0, 1] splits the same way). The strengths are fitted by the MM
    algorithm of Hunter (2004), until the largest change of a log-strength is below `tol` or
    after `iterations` steps, and are returned as plain strengths scaled so that their
    geometric mean is 1 (so log-strengths sum to 0; s_a / s_b is the odds that a beats b).

    Regularisation: as in Coulom's BayesElo, every player gets `prior` virtual games (one by
    default) against a reference player of strength 1, scored as ties. This keeps a player
    with no wins (or no losses) finite and shrinks strengths from few games toward each other;
    with many games it barely matters. `prior=0` gives the plain maximum-likelihood estimate,
    which exists only if the "scored against" graph is strongly connected (every split of the
    players has someone on each side scoring against the other); otherwise ValueError.

    No matches give an empty dict.
    """
    if prior < 0 or not math.isfinite(prior):
        raise ValueError(f"prior must be finite and >= 0, got {prior}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    players = _players(matches)
    if not players:
        return {}
    index = {name: i for i, name in enumerate(players)}
    games, wins = _tables(matches, index)
    if prior == 0.0 and not _strongly_connected(wins):
        raise ValueError(
            "the maximum-likelihood strengths do not exist: some group of players never "
            "scored against the rest; use prior > 0"
        )
    strengths = _fit(games, wins, prior=prior, iterations=iterations, tol=tol)
    return {name: float(strengths[i]) for name, i in index.items()}


def bradley_terry_bootstrap(
    matches: Sequence[tuple[str, str, float]],
    *,
    rounds: int = 200,
    seed: int = 0,
    confidence: float = 0.95,
    prior: float = BT_PRIOR,
    iterations: int = 1000,
    tol: float = 1e-10,
) -> dict[str, BtEstimate]:
    """Bradley-Terry strengths (see `bradley_terry`) with bootstrap percentile intervals.

    Each of `rounds` resamples draws len(matches) matches with replacement and refits every
    player of the original data (one absent from a resample keeps only the prior); `low` and
    `high` are the (1 - confidence)/2 and (1 + confidence)/2 percentiles of a player's
    resampled strengths (numpy's linear interpolation), and `strength` is the fit on all the
    matches. The same `seed` gives the same result. `prior` must be > 0 here: a resample can
    easily lose the connectivity the unregularised estimate needs. No matches give {}.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if prior <= 0 or not math.isfinite(prior):
        raise ValueError(f"the bootstrap needs a finite prior > 0, got {prior}")
    point = bradley_terry(matches, iterations=iterations, tol=tol, prior=prior)
    if not point:
        return {}
    players = list(point)
    index = {name: i for i, name in enumerate(players)}
    rng = np.random.default_rng(seed)
    samples = np.empty((rounds, len(players)), dtype=np.float64)
    for r in range(rounds):
        picks = rng.integers(0, len(matches), size=len(matches))
        resample = [matches[int(i)] for i in picks]
        games, wins = _tables(resample, index)
        samples[r] = _fit(games, wins, prior=prior, iterations=iterations, tol=tol)
    tail = (1.0 - confidence) / 2.0
    low, high = np.percentile(samples, [100.0 * tail, 100.0 * (1.0 - tail)], axis=0)
    return {
        name: BtEstimate(strength=point[name], low=float(low[i]), high=float(high[i]))
        for name, i in index.items()
    }
