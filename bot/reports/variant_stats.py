"""Pure statistics for comparing model variants in an A/B experiment: chat-level (cluster-robust)
intervals and tests for 👍 rates, always-valid (anytime) bounds on the lift, bounded intervals
for 1-5 ratings, a sample-ratio-mismatch check on the assignment, latency percentiles and
inverse-propensity rates (the arena's Bradley-Terry strengths: bot/reports/bradley_terry.py).
No I/O and no state: every function maps numbers to numbers.

The unit is the chat. Chats are what the experiment randomises, and one chat votes many times
with its own propensity, so its votes are not independent: a test that counts votes as
independent trials (`two_proportion_test`, kept for contrast and for the benchmark) calls far
too many A/A differences significant. Every 👍-rate figure of the report therefore takes one
`(up, votes)` pair per chat (after the per-user cap, `USER_VOTE_CAP`) and uses the ratio
estimator sum(up) / sum(votes) with its cluster-robust (CR1 sandwich, chats as clusters)
variance; see `clustered_rate`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: z for a two-sided 95% interval: the 0.975 quantile of the standard normal.
Z95 = 1.959963984540054

#: Below this p-value the assignment counts disagree with the configured weights.
SRM_ALPHA = 0.01

BANDIT_NOTE = (
    "Bandit allocation: the shares of new chats followed the votes as they came in. The plain "
    "rates are biased where a variant's share moved while users changed; the IPW rates and the "
    "IPW lift weight each chat by 1 / the probability it was assigned with to correct for that. "
    "The fixed-horizon figures also assume a sample that was not chosen by looking at the data; "
    "the always-valid ones allow that, but like the plain rates assume users did not change "
    "while the shares moved."
)

FIXED_SAMPLE_NOTE = (
    "The fixed-horizon p-value and lift interval assume the sample size was fixed in advance "
    "and are read once. Checking them repeatedly while data arrive and stopping at the first "
    "p < 0.05 ('peeking') inflates the false-positive rate well above 5%."
)

ALWAYS_VALID_NOTE = (
    "The always-valid bound and p-value may be read at any time, as often as you like: "
    "stopping at the first always-valid p < 0.05 (or bound that excludes 0) keeps the "
    "false-positive rate at 5%."
)

#: Fewer chats than this with votes (or with ratings) in a group: no interval and no test
#: ("n/a (too few)"). The cluster-robust variance is estimated from the spread between chats;
#: with two to four chats that spread is too noisy to be worth a number.
MIN_CHATS = 5

#: The per-user cap: within one variant, one user's votes count as at most this many votes
#: (a user with m > 10 votes has each vote weighted 10 / m), so a thousand votes from one
#: account weigh like ten. Applied where the report reads the votes (`chat_votes` in
#: bot/reports/chat_votes.py), before any figure is computed.
USER_VOTE_CAP = 10

#: The always-valid bound is tuned to be tightest at this many chats with votes (both groups
#: together); it stays valid at every other sample size, only a little wider there. See
#: `always_valid_lift`.
PLANNED_CHATS = 1000

#: The level the always-valid boundary's mixing parameter is tuned at (the tuning is fixed in
#: advance, so the p-value is one number for every level).
DESIGN_ALPHA = 0.05


# scipy is imported where a function needs it (the t and chi-square tails), so that the /stats
# line, which shows a chat-level 👍 interval, does not load it.


def _two_sided(z: float) -> float:
    """The two-sided standard normal tail P(|Z| >= |z|) = erfc(|z| / sqrt 2)."""
    return min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


# --- rates -----------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion `successes / n` (95% by default).

    Unlike the normal ("Wald") interval it stays inside [0, 1] and behaves at 0 and n
    successes. With `n == 0` nothing is known and the interval is the whole (0.0, 1.0).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if z <= 0:
        raise ValueError(f"z must be positive, got {z}")
    if n == 0:
        return (0.0, 1.0)
    return _wilson(successes / n, n, z)


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval around a proportion `p` from `n` > 0 trials; `n` may be an
    effective (fractional) number of trials."""
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True, slots=True)
class ProportionTest:
    """A two-proportion z-test. `difference` is p2 - p1 (variant minus control when called as
    `two_proportion_test(control..., variant...)`); `p_value` is two-sided."""

    difference: float
    z: float
    p_value: float


def two_proportion_test(x1: int, n1: int, x2: int, n2: int) -> ProportionTest:
    """Two-sided z-test of p1 == p2 for `x1` successes of `n1` against `x2` of `n2`.

    Counts every trial as independent. Votes are not (a chat votes many times with its own
    propensity), so the report no longer uses this test for 👍 rates (see `chat_lift_test`);
    it stays for contrast, in the tests and in bench/aa.py.

    The standard error is the pooled one, sqrt(p(1-p)(1/n1 + 1/n2)) with p = (x1+x2)/(n1+n2),
    and `z = (p2 - p1) / se`, so a positive z means the second group converts more.

    See `FIXED_SAMPLE_NOTE`: the p-value is valid for a sample size fixed in advance; peeking
    at it repeatedly and stopping when it looks significant inflates false positives.

    Degenerate inputs carry no evidence: if either group is empty (`difference` is then NaN)
    or the pooled rate is 0 or 1 (`difference` is 0), the result has z = 0.0, p_value = 1.0.
    """
    for x, n in ((x1, n1), (x2, n2)):
        if n < 0 or not 0 <= x <= n:
            raise ValueError(f"need 0 <= x <= n, got x={x}, n={n}")
    if n1 == 0 or n2 == 0:
        return ProportionTest(difference=math.nan, z=0.0, p_value=1.0)
    p1, p2 = x1 / n1, x2 / n2
    pooled = (x1 + x2) / (n1 + n2)
    if pooled <= 0.0 or pooled >= 1.0:
        return ProportionTest(difference=p2 - p1, z=0.0, p_value=1.0)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z = (p2 - p1) / se
    p_value = _two_sided(z)
    return ProportionTest(difference=p2 - p1, z=z, p_value=min(1.0, p_value))


# --- chat-level rates (the chat is the unit) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusteredRate:
    """A 👍 rate with the chat as the unit (see `clustered_rate`)."""

    rate: float  # sum(w * up) / sum(w * votes); NaN without votes
    low: float  # 95% interval within [0, 1]; NaN with fewer than MIN_CHATS chats
    high: float
    se: float  # cluster-robust (CR1) standard error of `rate`; NaN below two chats
    chats: int  # chats with votes
    votes: float  # their votes (after the per-user cap), unweighted
    effective_votes: float  # how many independent votes the interval is worth (<= votes)


@dataclass(frozen=True, slots=True)
class _Group:
    rate: float
    var: float  # CR1 variance of `rate`; NaN below two chats
    chats: int
    votes: float


def _group(chats: Sequence[tuple[float, float]], weights: Sequence[float] | None = None) -> _Group:
    """The ratio estimator sum(w up) / sum(w votes) of per-chat (up, votes) pairs, with its
    CR1 variance G / (G - 1) * sum(w^2 (up - r votes)^2) / (sum w votes)^2 over the G chats
    that have votes (and a weight above 0)."""
    if weights is not None and len(weights) != len(chats):
        raise ValueError(f"need one weight per chat, got {len(weights)} for {len(chats)} chats")
    up_l: list[float] = []
    n_l: list[float] = []
    w_l: list[float] = []
    for i, (up, n) in enumerate(chats):
        w = 1.0 if weights is None else float(weights[i])
        if not (0.0 <= up <= n) or not math.isfinite(n):
            raise ValueError(f"need 0 <= up <= votes per chat, got up={up}, votes={n}")
        if not (w >= 0.0 and math.isfinite(w)):
            raise ValueError(f"weights must be finite and >= 0, got {w}")
        if n > 0 and w > 0:
            up_l.append(float(up))
            n_l.append(float(n))
            w_l.append(w)
    g = len(up_l)
    if g == 0:
        return _Group(math.nan, math.nan, 0, 0.0)
    ups, ns, ws = (np.asarray(x, dtype=np.float64) for x in (up_l, n_l, w_l))
    total = float((ws * ns).sum())
    rate = float((ws * ups).sum()) / total
    if g < 2:
        return _Group(rate, math.nan, 1, float(ns.sum()))
    residual = ws * (ups - rate * ns)
    var = g / (g - 1) * float((residual * residual).sum()) / (total * total)
    return _Group(rate, var, g, float(ns.sum()))


def clustered_rate(
    chats: Sequence[tuple[float, float]],
    weights: Sequence[float] | None = None,
    *,
    z: float = Z95,
    min_chats: int = MIN_CHATS,
    binary: bool = True,
) -> ClusteredRate:
    """The 👍 rate of per-chat `(up, votes)` pairs with a chat-level 95% interval.

    Estimate: the ratio estimator r = sum(w up) / sum(w votes) (w = 1, or each chat's
    inverse-propensity weight: then it is the Hajek estimator). Variance: the ratio estimator's
    linearisation with chats as clusters, which is the cluster-robust sandwich of a regression
    of each vote on a constant clustered by chat, with the usual CR1 small-sample factor
    G / (G - 1) over the G chats:

        var(r) = G / (G - 1) * sum_i w_i^2 (up_i - r votes_i)^2 / (sum_i w_i votes_i)^2

    (tests/unit/reports/test_variant_stats.py checks it by hand and against a generic sandwich
    computation). A chat that votes 👍 ten times in a row adds one chat's worth of evidence,
    not ten votes' worth.

    Interval: a Wilson score interval with the effective number of votes
    n_eff = r (1 - r) / var(r) (the design-effect construction of Korn and Graubard, 1998),
    capped at the real number of votes (never more precise than independent votes; this also
    covers r = 0 or 1, where the sandwich is 0). Unlike r +- z se it stays inside [0, 1] and
    behaves near 0 and 1. With fewer than `min_chats` chats the spread between chats cannot be
    estimated usefully and the interval is NaN ("n/a (too few)") rather than a wrong one.

    `binary=False` is for shares of values inside [0, 1] that are not 0/1 votes (scaled
    ratings, `rating_interval`): their variance can lie far below the Bernoulli r (1 - r), so
    n_eff is not capped at the count (which would widen the interval to the worst case);
    only where the sandwich is 0 (every value the same) does the count stand in for it.
    """
    group = _group(chats, weights)
    if group.chats == 0:
        return ClusteredRate(math.nan, math.nan, math.nan, math.nan, 0, 0.0, 0.0)
    r = group.rate
    se = math.sqrt(group.var) if math.isfinite(group.var) else math.nan
    if group.chats < max(min_chats, 2):
        return ClusteredRate(r, math.nan, math.nan, se, group.chats, group.votes, math.nan)
    spread = r * (1.0 - r)
    n_eff = group.votes if spread <= 0.0 or group.var <= 0.0 else spread / group.var
    if binary:
        n_eff = min(n_eff, group.votes)
    low, high = _wilson(r, n_eff, z)
    return ClusteredRate(r, low, high, se, group.chats, group.votes, n_eff)


@dataclass(frozen=True, slots=True)
class LiftTest:
    """Fixed-horizon chat-level comparison of two 👍 rates: variant minus control."""

    lift: float  # difference of the chat-level rates; NaN when a group has no votes
    low: float  # 95% interval, within [-1, 1]; NaN with fewer than MIN_CHATS chats in a group
    high: float
    z: float  # lift / se; 0.0 when nothing is known
    p_value: float  # two-sided; 1.0 when nothing is known. See FIXED_SAMPLE_NOTE.
    chats: tuple[int, int]  # (control chats, variant chats) with votes


def _lift(
    control: Sequence[tuple[float, float]],
    variant: Sequence[tuple[float, float]],
    control_weights: Sequence[float] | None,
    variant_weights: Sequence[float] | None,
    min_chats: int,
) -> tuple[float, float, tuple[int, int]]:
    """(lift, its variance or NaN when too few chats, chats per group).

    The variance is the sum of the two groups' CR1 variances (independent chats), each floored
    at the pooled rate's binomial variance p (1 - p) / votes: chats are never worth more than
    independent votes, and two groups that both voted all 👍 (or all 👎) carry no spread to
    divide by."""
    a, b = _group(control, control_weights), _group(variant, variant_weights)
    chats = (a.chats, b.chats)
    lift = b.rate - a.rate if a.chats and b.chats else math.nan
    if min(chats) < max(min_chats, 2):
        return lift, math.nan, chats
    pooled = (a.rate * a.votes + b.rate * b.votes) / (a.votes + b.votes)
    spread = pooled * (1.0 - pooled)
    var = max(a.var, spread / a.votes) + max(b.var, spread / b.votes)
    return lift, var, chats


def chat_lift_test(
    control: Sequence[tuple[float, float]],
    variant: Sequence[tuple[float, float]],
    *,
    control_weights: Sequence[float] | None = None,
    variant_weights: Sequence[float] | None = None,
    z: float = Z95,
    min_chats: int = MIN_CHATS,
) -> LiftTest:
    """The fixed-horizon chat-level test of the 👍-rate lift (variant minus control).

    Takes per-chat `(up, votes)` pairs (optionally inverse-propensity weights per chat) and
    compares the two ratio estimators of `clustered_rate`: lift = r_variant - r_control,
    se = sqrt(var_control + var_variant) with each variance the CR1 cluster-robust one (floored,
    see `_lift`), the interval lift +- z se clipped to [-1, 1], and the two-sided normal
    p-value of lift / se (the delta-method Wald test with chats as clusters).

    This replaces the vote-level `two_proportion_test` as the report's p-value: counting votes
    as independent trials, that one called about half of simulated A/A experiments
    significant when each chat votes many times (bench/aa.py measures both).

    See FIXED_SAMPLE_NOTE: valid when read once, at a sample size fixed in advance; for a
    figure that may be watched, use `always_valid_lift`. Fewer than `min_chats` chats with
    votes in either group: interval NaN, z 0, p-value 1.0 (nothing known).
    """
    lift, var, chats = _lift(control, variant, control_weights, variant_weights, min_chats)
    if not math.isfinite(var) or var <= 0.0:
        return LiftTest(lift, math.nan, math.nan, 0.0, 1.0, chats)
    se = math.sqrt(var)
    stat = lift / se
    p_value = _two_sided(stat)
    low, high = max(-1.0, lift - z * se), min(1.0, lift + z * se)
    return LiftTest(lift, low, high, stat, p_value, chats)


@dataclass(frozen=True, slots=True)
class SequentialLift:
    """Variant minus control 👍-rate lift with the chat as the unit."""

    lift: float  # chat-level difference of 👍 rates (variant - control), 0.05 = +5 pp; NaN
    # when a group has no votes
    low: float  # always-valid (anytime) 95% lower bound on the lift; -1.0 when nothing is known
    high: float  # always-valid 95% upper bound; 1.0 when nothing is known
    p_value: float  # always-valid p-value for "no difference"; 1.0 when nothing is known
    chats: tuple[int, int]  # (control chats, variant chats) that had votes


def _mixing(chats: int, planned_chats: int) -> float:
    """s = tau^2 / var: the normal mixture's variance over the estimator's, at `chats` chats.

    Howard et al. (2021, eq. 3.11 and section 3.5) choose the mixture so that the boundary is
    tightest at a planned intrinsic time m: rho = m / (-2 log a + log(1 - 2 log a)). In the
    estimator's scale (var ~ sigma^2 / chats) that is tau^2 = c var(planned_chats) with
    c = -2 log a + log(1 - 2 log a), i.e. s = c chats / planned_chats, a = DESIGN_ALPHA."""
    c = -2.0 * math.log(DESIGN_ALPHA) + math.log(1.0 - 2.0 * math.log(DESIGN_ALPHA))
    return c * chats / planned_chats


def always_valid_lift(
    control: Sequence[tuple[float, float]],
    variant: Sequence[tuple[float, float]],
    alpha: float = 0.05,
    *,
    planned_chats: int = PLANNED_CHATS,
    min_chats: int = MIN_CHATS,
) -> SequentialLift:
    """An always-valid (anytime) 95% confidence sequence and p-value for the 👍-rate lift.

    Construction: the asymptotic confidence sequence of Waudby-Smith et al. (2021,
    "Time-uniform central limit theory") built on the normal-mixture boundary of Howard et al.
    (2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences"), the one
    GrowthBook's sequential testing uses; it is the mixture SPRT (mSPRT, Johari et al. 2017)
    for the lift with a normal mixture N(0, tau^2), written with an estimated variance.
    With lift d and its chat-level (CR1, see `chat_lift_test`) variance v over G chats:

        s = tau^2 / v = c G / PLANNED_CHATS   (c from DESIGN_ALPHA; see `_mixing`)
        bound:   d +- sqrt(v (1 + s) / s * log((1 + s) / alpha^2))
        p-value: min(1, sqrt(1 + s) * exp(-d^2 s / (2 v (1 + s))))   (1 / the mixture
                 likelihood ratio; 0 lies outside the bound exactly when p < alpha)

    Why this one: it needs only the estimate and its variance, so it takes the chat-level
    (cluster-robust) variance directly, and with chats as the unit the asymptotic CLT
    behind it is about chats, which is what the experiment randomises; the mixing parameter is
    set once for a planned number of chats (PLANNED_CHATS), and the bound is valid, only wider,
    at any other number. The guarantee is time-uniform: over all the times it is read, the
    chance that the bound ever excludes the true lift (or that p ever drops below alpha in
    an A/A test) is at most alpha, so an operator may watch it every minute and stop at the
    first decision. Each call uses only the data at that time (no running intersection); the
    guarantee holds for "stop at the first time it excludes 0", which is how it is read.

    Fewer than `min_chats` chats with votes in either group: nothing is known (-1, 1, p 1).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if planned_chats < 1:
        raise ValueError(f"planned_chats must be >= 1, got {planned_chats}")
    lift, var, chats = _lift(control, variant, None, None, min_chats)
    if not math.isfinite(var) or var <= 0.0 or not math.isfinite(lift):
        return SequentialLift(lift, -1.0, 1.0, 1.0, chats)
    s = _mixing(sum(chats), planned_chats)
    half = math.sqrt(var * (1.0 + s) / s * math.log((1.0 + s) / (alpha * alpha)))
    p_value = min(1.0, math.sqrt(1.0 + s) * math.exp(-lift * lift * s / (2.0 * var * (1.0 + s))))
    return SequentialLift(lift, max(-1.0, lift - half), min(1.0, lift + half), p_value, chats)


# --- means and latency -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeanInterval:
    """A sample mean with its Student-t confidence interval [low, high] over `n` values.

    `mean` is NaN when n == 0; `low` and `high` are NaN when n < 2 (no spread to estimate)."""

    mean: float
    low: float
    high: float
    n: int


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> MeanInterval:
    """The mean of `values` with a two-sided Student-t interval at `confidence`.

    Uses the sample standard deviation (n - 1 in the denominator) and the t quantile with n - 1
    degrees of freedom. With fewer than two values the bounds are NaN (an infinite interval
    would read as a number), and with none the mean is NaN too.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    data = np.asarray(values, dtype=np.float64)
    n = int(data.size)
    if n == 0:
        return MeanInterval(mean=math.nan, low=math.nan, high=math.nan, n=0)
    mean = float(data.mean())
    if n < 2:
        return MeanInterval(mean=mean, low=math.nan, high=math.nan, n=n)
    se = float(data.std(ddof=1)) / math.sqrt(n)
    import scipy.stats  # type: ignore[import-untyped]

    t = float(scipy.stats.t.ppf((1.0 + confidence) / 2.0, n - 1))
    return MeanInterval(mean=mean, low=mean - t * se, high=mean + t * se, n=n)


def rating_interval(
    chats: Sequence[Sequence[float]],
    *,
    scale: tuple[float, float] = (1.0, 5.0),
    z: float = Z95,
    min_chats: int = MIN_CHATS,
) -> MeanInterval:
    """The mean rating with a 95% interval that stays on the `scale`, the chat as the unit.

    `chats` holds each chat's ratings (a chat may rate several conversations). The ratings
    are mapped to [0, 1] by x = (rating - lo) / (hi - lo) and treated like 👍 shares: the
    ratio estimator sum(x) / count with its cluster-robust variance and a Wilson interval with
    the effective count n_eff = m (1 - m) / var (`clustered_rate` with binary=False), mapped
    back to the scale. Why Wilson: it is the score interval of a mean m with variance
    m (1 - m) / n_eff, the same standard error as the sandwich at m, but it shrinks towards
    the middle near the ends and lies inside [0, 1] by construction, also at all-1s and all-5s
    (there the sandwich is 0 and the count of ratings stands in for n_eff). A t-interval
    (even clipped) can leave the scale or collapse to a point; a percentile bootstrap stays
    inside but is unreliable at the small samples where it matters. Fewer than `min_chats`
    rated chats: bounds NaN.
    """
    lo, hi = scale
    if not hi > lo:
        raise ValueError(f"need a scale with high > low, got {scale}")
    pairs: list[tuple[float, float]] = []
    n = 0
    for ratings in chats:
        for value in ratings:
            if not lo <= value <= hi:
                raise ValueError(f"rating {value} lies outside the scale {lo:g}..{hi:g}")
        if len(ratings):
            pairs.append((sum((v - lo) / (hi - lo) for v in ratings), float(len(ratings))))
            n += len(ratings)
    if n == 0:
        return MeanInterval(mean=math.nan, low=math.nan, high=math.nan, n=0)
    rate = clustered_rate(pairs, z=z, min_chats=min_chats, binary=False)
    mean = lo + (hi - lo) * rate.rate
    if math.isnan(rate.low):
        return MeanInterval(mean=mean, low=math.nan, high=math.nan, n=n)
    return MeanInterval(
        mean=mean, low=lo + (hi - lo) * rate.low, high=lo + (hi - lo) * rate.high, n=n
    )


def latency_percentiles(values: Sequence[float]) -> tuple[float, float]:
    """The (p50, p95) of `values` with numpy's default linear interpolation between order
    statistics; (nan, nan) for no values."""
    if len(values) == 0:
        return (math.nan, math.nan)
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50.0, 95.0])
    return (float(p50), float(p95))


# --- assignment ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SrmResult:
    """A chi-square goodness-of-fit test of the assigned counts against the configured weights.
    `warn` is True when `p_value < SRM_ALPHA` (a sample ratio mismatch: the assignment is off)."""

    chi2: float
    dof: int
    p_value: float
    warn: bool


def sample_ratio_mismatch(observed: Mapping[str, int], weights: Mapping[str, float]) -> SrmResult:
    """Checks whether the per-variant assignment counts match the configured split.

    Only variants with weight > 0 enter; one missing from `observed` counts 0, and counts of
    variants with no (or zero) weight are ignored. Expected count = total * w / sum(w), where
    total is the sum of the entering counts; chi2 = sum((obs - exp)^2 / exp) with k - 1 degrees
    of freedom. With fewer than two weighted variants, or no assignments, there is nothing to
    test: chi2 0.0, p_value 1.0, warn False.
    """
    for name, w in weights.items():
        if w < 0 or not math.isfinite(w):
            raise ValueError(f"weight of {name!r} must be finite and >= 0, got {w}")
    for name, count in observed.items():
        if count < 0:
            raise ValueError(f"count of {name!r} must be >= 0, got {count}")
    # Checked finite and >= 0 above: the weights are expected counts up to a scale.
    return sample_ratio_against(observed, weights)


def sample_ratio_against(observed: Mapping[str, int], expected: Mapping[str, float]) -> SrmResult:
    """The same chi-square test against expected counts given directly (the sums of the
    recorded allocation probabilities, when the shares moved during the experiment).

    Only variants with an expected count above 0 enter; the expected counts are scaled to the
    observed total of those variants. Fewer than two, or no chats: nothing to test.
    """
    active = [name for name, e in expected.items() if e > 0 and math.isfinite(e)]
    counts = [observed.get(name, 0) for name in active]
    total, mass = sum(counts), sum(expected[name] for name in active)
    dof = max(len(active) - 1, 0)
    if len(active) < 2 or total == 0:
        return SrmResult(chi2=0.0, dof=dof, p_value=1.0, warn=False)
    chi2 = 0.0
    for name, count in zip(active, counts, strict=True):
        want = total * expected[name] / mass
        chi2 += (count - want) ** 2 / want
    import scipy.stats

    p_value = float(scipy.stats.chi2.sf(chi2, dof))
    return SrmResult(chi2=chi2, dof=dof, p_value=p_value, warn=p_value < SRM_ALPHA)


@dataclass(frozen=True, slots=True)
class WeightedRate:
    """A 👍 rate from chats weighted by 1 / their assignment probability."""

    rate: float  # NaN without votes
    low: float  # 95% chat-level interval within [0, 1] (see ipw_rate); NaN: too few chats
    high: float
    chats: int  # chats whose votes entered
    effective_chats: float  # (sum w)^2 / sum w^2: how many equally weighted chats it is worth


def ipw_rate(
    chats: Sequence[tuple[float, float, float]], z: float = Z95, min_chats: int = MIN_CHATS
) -> WeightedRate:
    """The self-normalised inverse-propensity (Hajek) 👍 rate of (up, down, probability) per
    chat: sum(w * up) / sum(w * votes) with w = 1 / probability, the ratio of the
    Horvitz-Thompson totals of 👍 and of votes. With one probability for every chat it is
    the plain rate. The chat is the unit: the interval is `clustered_rate`'s (the ratio
    estimator's linearised CR1 variance, sum(w^2 (up - r * votes)^2) / (sum(w * votes))^2 times
    G / (G - 1), in a Wilson interval with the effective number of votes), NaN with fewer than
    `min_chats` chats."""
    used = [(up, down, p) for up, down, p in chats if up + down > 0 and p > 0]
    if not used:
        return WeightedRate(math.nan, math.nan, math.nan, 0, 0.0)
    weights = [1.0 / p for *_, p in used]
    rate = clustered_rate(
        [(up, up + down) for up, down, _ in used], weights, z=z, min_chats=min_chats
    )
    ess = sum(weights) ** 2 / sum(w * w for w in weights)
    return WeightedRate(rate.rate, rate.low, rate.high, len(used), ess)
