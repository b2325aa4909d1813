"""The variants report for people (`admin variants`, `--plot`): the fixed-width text of a
VariantReport (bot/reports/variants.py) and its PNG plot of the 👍 rates.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path

from bot.reports.variant_stats import MIN_CHATS, SRM_ALPHA
from bot.reports.variants import Comparison, VariantFigures, VariantReport

NOTE_WIDTH = 96
TOO_FEW = "n/a (too few)"


def _num(value: float, spec: str, suffix: str = "") -> str:
    return "n/a" if math.isnan(value) else f"{value:{spec}}{suffix}"


def _interval(low: float, high: float, spec: str, suffix: str = "", *, known: bool = False) -> str:
    """`low..high`; without bounds "n/a", or "n/a (too few)" when there is data (`known`)
    but too little for an interval."""
    if math.isnan(low) or math.isnan(high):
        return TOO_FEW if known else "n/a"
    return f"{low:{spec}}..{high:{spec}}{suffix}"


def _pp(low: float, high: float) -> str:
    """A lift interval in percentage points: `-1.2..+3.4 pp`."""
    if math.isnan(low) or math.isnan(high):
        return TOO_FEW
    return f"{100 * low:+.1f}..{100 * high:+.1f} pp"


def verdict(c: Comparison) -> str:
    """What the always-valid bound says now, in words (it may be read at any time)."""
    if c.always_valid_low > 0:
        return f"{c.variant} is better (the bound is above 0)"
    if c.always_valid_high < 0:
        return f"{c.variant} is worse (the bound is below 0)"
    if min(c.control_chats, c.variant_chats) < MIN_CHATS:
        return f"no decision (fewer than {MIN_CHATS} chats with votes on a side)"
    return "no decision yet (the bound contains 0)"


def _pct(value: float) -> str:
    return _num(100.0 * value, ".1f", "%")


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Fixed width: the first column left-aligned, the others right-aligned."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(columns), "  ".join("-" * w for w in widths), *map(line, rows)])


COLUMNS = (
    "variant",
    "weight",
    "chats",
    "turns",
    "up",
    "down",
    "up rate",
    "95% CI",
    "ratings",
    "mean",
    "95% CI",
    "p50 ms",
    "p95 ms",
    "model p50",
    "chars",
)


def _label(f: VariantFigures) -> str:
    if f.control:
        return f"{f.name} (control)"
    if not f.served:
        return f"{f.name} (not served)"
    return f.name


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3f}"


def format_variant_report(report: VariantReport) -> str:
    """A fixed-width table, one line per comparison with the control, the SRM line, the note."""
    lines = [
        f"experiment {report.experiment}, control {report.control}",
        "",
        _table(COLUMNS, [_variant_row(f) for f in report.variants]),
        "",
        *_comparison_lines(report),
    ]
    if report.recorded:
        lines += _ipw_lines(report)
    lines += _srm_lines(report)
    if report.arena:
        lines += ["", "arena (Bradley-Terry strength, 95% bootstrap interval; 1 = average):"]
        for i, r in enumerate(report.arena, start=1):
            lines.append(
                f"  {i}. {r.name}: {r.strength:.2f} [{r.low:.2f}..{r.high:.2f}], "
                f"{r.matches} duels, {r.wins} won, {r.ties} both bad"
            )
    lines += ["", *format_guards(report)]
    if report.bandit:
        lines += ["", f"allocation: {report.allocation} (a bandit chose some of the chats)"]
    lines += ["", textwrap.fill(f"Note: {report.note}", width=NOTE_WIDTH)]
    return "\n".join(lines)


def _variant_row(f: VariantFigures) -> tuple[str, ...]:
    """One variant's line of the table (COLUMNS)."""
    return (
        _label(f),
        f"{f.weight:g}",
        f"{f.chats:,}",
        f"{f.turns:,}",
        f"{f.votes_up:,}",
        f"{f.votes_down:,}",
        _pct(f.up_rate),
        _interval(100 * f.up_low, 100 * f.up_high, ".1f", "%", known=f.votes > 0),
        f"{f.ratings:,}",
        _num(f.rating_mean, ".2f"),
        _interval(f.rating_low, f.rating_high, ".2f", known=f.ratings > 0),
        _num(f.latency_p50_ms, ".0f"),
        _num(f.latency_p95_ms, ".0f"),
        _num(f.model_p50_ms, ".0f"),
        _num(f.reply_chars, ".1f"),
    )


def _comparison_lines(report: VariantReport) -> list[str]:
    """Each variant against the control: the 👍 lift (always valid and fixed horizon) and the
    difference in mean rating."""
    lines: list[str] = []
    by_name = {f.name: f for f in report.variants}
    base = by_name[report.control]
    for c in report.comparisons:
        f = by_name[c.variant]
        rating_part = (
            "mean rating n/a"
            if math.isnan(c.rating_diff)
            else f"mean rating {c.rating_diff:+.2f} ({f.rating_mean:.2f} vs {base.rating_mean:.2f})"
        )
        if math.isnan(c.lift):
            lines.append(
                f"{c.variant} vs {c.control}: up rate n/a (votes: {f.votes} vs {base.votes}); "
                f"{rating_part}"
            )
            continue
        lines.append(
            f"{c.variant} vs {c.control}: up rate {100 * c.lift:+.1f} pp ({_pct(f.up_rate)} vs "
            f"{_pct(base.up_rate)}), chats with votes {c.variant_chats} vs {c.control_chats}; "
            f"{rating_part}"
        )
        if min(c.control_chats, c.variant_chats) < MIN_CHATS:
            lines.append(f"  always valid and fixed horizon: {TOO_FEW}: {verdict(c)}")
            continue
        lines += [
            f"  always valid (read any time): {_pp(c.always_valid_low, c.always_valid_high)}, "
            f"{_p(c.always_valid_p)}: {verdict(c)}",
            f"  fixed horizon (read once): 95% CI {_pp(c.lift_low, c.lift_high)}, "
            f"z = {c.z:.2f}, {_p(c.p_value)}",
        ]
    return lines


def _ipw_lines(report: VariantReport) -> list[str]:
    """The inverse-propensity 👍 rates and lifts, where allocation probabilities are recorded."""
    lines = [
        "inverse-propensity 👍 rates (each chat's votes weighted by 1 / the probability it "
        "was assigned with; plain rate in brackets):"
    ]
    for f in report.variants:
        if f.ipw_chats:
            lines.append(
                f"  {f.name}: {_pct(f.ipw_up_rate)} "
                f"[{_interval(100 * f.ipw_low, 100 * f.ipw_high, '.1f', '%', known=True)}] "
                f"({_pct(f.up_rate)}), {f.ipw_chats} chats "
                f"(worth {f.ipw_effective_chats:.1f} equally weighted)"
            )
        else:
            lines.append(f"  {f.name}: n/a (no votes from chats with a recorded probability)")
    for c in report.comparisons:
        if not math.isnan(c.ipw_lift):
            lines.append(
                f"  {c.variant} vs {c.control} (IPW, fixed horizon): "
                f"{100 * c.ipw_lift:+.1f} pp, 95% CI {_pp(c.ipw_lift_low, c.ipw_lift_high)}, "
                f"{_p(c.ipw_p_value)}"
            )
    return lines


def _srm_lines(report: VariantReport) -> list[str]:
    """The sample-ratio check of the hash-assigned chats, with its warning."""
    lines: list[str] = []
    srm = report.srm
    against = "their recorded allocation probabilities" if report.recorded else "the weights"
    if srm.dof:
        lines.append(
            f"sample ratio (hash-assigned chats against {against}): "
            f"chi2 = {srm.chi2:.2f}, df {srm.dof}, {_p(srm.p_value)}" + ("" if srm.warn else ", ok")
        )
        if srm.warn:
            lines += [
                f"  WARNING: sample ratio mismatch (p < {SRM_ALPHA:g}): the chats do not follow "
                f"{against};",
                "  find out why before trusting any comparison",
            ]
    else:
        lines.append("sample ratio: nothing to test (fewer than two variants with a weight)")
    return lines


GUARD_COLUMNS = ("variant", "replies read", "distinct", "repetitive", "safety", "failed", "p95 ms")


def format_guards(report: VariantReport) -> list[str]:
    """The guard metrics table, the autopilot's state and its recent decisions."""
    rows = [
        (
            _label(f),
            f"{f.guard_window:,}",
            _pct(f.distinct_share),
            _pct(f.repetition_share),
            _pct(f.safety_share),
            f"{_pct(f.failed_share)} ({f.failed_turns:,})",
            _num(f.latency_p95_ms, ".0f"),
        )
        for f in report.variants
    ]
    lines = [
        "guards (distinct, repetitive: of the replies read, the most recent; safety, failed: "
        "of all):",
        _table(GUARD_COLUMNS, rows),
        "",
    ]
    if report.autopilot is None:
        lines.append("autopilot: off (`admin variants autopilot on` turns it on)")
    else:
        policy = ", ".join(f"{k} {v:g}" for k, v in sorted(report.autopilot.items()))
        lines.append(f"autopilot: on ({policy})")
    if report.decisions:
        lines.append("autopilot decisions, newest first:")
    for d in report.decisions:
        lines.append(
            f"  {d.created_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} {d.action} {d.variant} "
            f"(control {d.control}, version {d.based_on}, by {d.decided_by}): {d.reason}"
        )
    return lines


# --- plot ------------------------------------------------------------------------------------


def plot_variants(report: VariantReport, path: str | Path) -> None:
    """A PNG: each variant's 👍 rate with its 95% chat-level interval; the control stands out.

    Variants without votes show only a (0-100%) bar, those with too few chats for an interval
    only their rate. Needs matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError(
            "plotting needs matplotlib, which is not installed: pip install matplotlib"
        ) from err

    names = [_label(f) for f in report.variants]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(names) + 1.5), 4.0))
    try:
        for x, f in enumerate(report.variants):
            colour = "tab:red" if f.control else ("tab:blue" if f.served else "tab:gray")
            if f.votes:
                few = math.isnan(f.up_low) or math.isnan(f.up_high)
                ax.errorbar(
                    [x],
                    [100 * f.up_rate],
                    yerr=None
                    if few
                    else [[100 * (f.up_rate - f.up_low)], [100 * (f.up_high - f.up_rate)]],
                    fmt="D" if f.control else "o",
                    color=colour,
                    capsize=6,
                    markersize=8,
                )
                ax.annotate(
                    f"{100 * f.up_rate:.0f}% ({f.vote_chats} chats"
                    + (", too few for an interval)" if few else ")"),
                    (x, 100 * f.up_rate),
                    textcoords="offset points",
                    xytext=(10, 0),
                    va="center",
                )
            else:
                ax.errorbar([x], [50.0], yerr=[[50.0], [50.0]], fmt="none", color=colour, capsize=6)
                ax.annotate("no votes", (x, 50.0), textcoords="offset points", xytext=(10, 0))
        base = report.get(report.control)
        if base is not None and base.votes:
            ax.axhline(100 * base.up_rate, color="tab:red", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylim(0, 105)
        ax.set_yticks(range(0, 101, 20))
        ax.set_ylabel("thumbs-up rate, % (95% chat-level interval)")
        ax.set_title(f"experiment {report.experiment}")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(Path(path), format="png", dpi=100)
    finally:
        plt.close(fig)
