"""Server-drawn SVG charts: geometry here, markup in templates/_charts.html.

Only coordinates are computed here; every label reaches the SVG through Jinja's autoescaping,
so a variant name cannot inject markup. No JavaScript, no chart library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.reports.dashboard import DayPoint
from bot.reports.variants import VariantReport

WIDTH = 720
HEIGHT = 240
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 36


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top` (1, 2 or 5 times a power of ten apart)."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _short(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class Tick:
    """A horizontal grid line with its label."""

    y: float
    label: str


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar (a day) of a bar chart."""

    x: float
    y: float
    width: float
    height: float
    label: str  # x-axis label ('' where skipped to avoid crowding)
    title: str  # tooltip


@dataclass(frozen=True, slots=True)
class Series:
    """A polyline (gaps split it) and its points."""

    name: str
    css: str
    segments: list[str]  # SVG `points` attributes
    dots: list[tuple[float, float, str]]  # x, y, tooltip


class _PlotArea:
    """The plot area inside a chart's margins (both chart kinds draw their axes from it)."""

    width: int
    height: int

    @property
    def plot_left(self) -> int:
        """x of the y axis."""
        return LEFT

    @property
    def plot_right(self) -> int:
        """x of the plot's right edge."""
        return self.width - RIGHT

    @property
    def plot_bottom(self) -> int:
        """y of the x axis."""
        return self.height - BOTTOM


@dataclass(frozen=True)
class Chart(_PlotArea):
    """What the chart macros draw."""

    title: str
    width: int = WIDTH
    height: int = HEIGHT
    ticks: list[Tick] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    xlabels: list[tuple[float, str]] = field(default_factory=list)
    empty: bool = False


def _y(value: float, top: float) -> float:
    span = HEIGHT - TOP - BOTTOM
    return round(HEIGHT - BOTTOM - span * (value / top if top else 0), 1)


def _label_every(n: int) -> int:
    return max(1, math.ceil(n / 10))


def messages_chart(points: Sequence[DayPoint]) -> Chart:
    """Messages per UTC day, as bars."""
    ticks = nice_ticks(max((p.messages for p in points), default=0))
    top = ticks[-1]
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(points))
    every = _label_every(len(points))
    bars = []
    for i, p in enumerate(points):
        y = _y(p.messages, top)
        bars.append(
            Bar(
                x=round(LEFT + i * slot + slot * 0.15, 1),
                y=y,
                width=round(slot * 0.7, 1),
                height=round(HEIGHT - BOTTOM - y, 1),
                label=f"{p.day:%m-%d}" if i % every == 0 else "",
                title=f"{p.day.isoformat()}: {p.messages:,} messages",
            )
        )
    return Chart(
        title="Messages per day (UTC)",
        ticks=[Tick(_y(t, top), _short(t)) for t in ticks],
        bars=bars,
        empty=not any(p.messages for p in points),
    )


def latency_chart(points: Sequence[DayPoint]) -> Chart:
    """Reply latency p50 and p95 per UTC day, as two lines (a day without replies is a gap)."""
    highest = max((p.latency_p95_ms or 0.0 for p in points), default=0.0)
    ticks = nice_ticks(highest)
    top = ticks[-1]
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(points))
    every = _label_every(len(points))

    def series(name: str, css: str, pick: str) -> Series:
        segments: list[str] = []
        dots: list[tuple[float, float, str]] = []
        current: list[str] = []
        for i, p in enumerate(points):
            value = getattr(p, pick)
            if value is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            x = round(LEFT + (i + 0.5) * slot, 1)
            y = _y(value, top)
            current.append(f"{x},{y}")
            tip = f"{p.day.isoformat()}: {name} {value:.0f} ms (n={p.latency_samples})"
            dots.append((x, y, tip))
        if current:
            segments.append(" ".join(current))
        return Series(name, css, segments, dots)

    xlabels = [
        (round(LEFT + (i + 0.5) * slot, 1), f"{p.day:%m-%d}")
        for i, p in enumerate(points)
        if i % every == 0
    ]
    return Chart(
        title="Reply latency per day (ms)",
        ticks=[Tick(_y(t, top), _short(t)) for t in ticks],
        series=[series("p50", "p50", "latency_p50_ms"), series("p95", "p95", "latency_p95_ms")],
        xlabels=xlabels,
        empty=not any(p.latency_samples for p in points),
    )


@dataclass(frozen=True, slots=True)
class Interval:
    """One variant in the interval chart: its thumbs-up rate and 95% chat-level interval."""

    name: str
    x: float
    y: float | None  # None: no votes (only the 0-100% interval is drawn)
    # y_low == y_high == y: votes from too few chats for an interval (only the rate is drawn)
    y_low: float
    y_high: float
    control: bool
    served: bool
    label: str


@dataclass(frozen=True)
class IntervalChart(_PlotArea):
    """The variants page's chart, the SVG twin of `admin variants --plot`."""

    title: str
    intervals: list[Interval]
    ticks: list[Tick]
    control_y: float | None
    width: int
    height: int = HEIGHT


def interval_chart(report: VariantReport) -> IntervalChart:
    """Each variant's thumbs-up rate with its 95% chat-level interval (from the report, not
    recomputed)."""
    width = max(360, LEFT + RIGHT + 150 * len(report.variants))
    slot = (width - LEFT - RIGHT) / max(1, len(report.variants))
    intervals = []
    for i, f in enumerate(report.variants):
        has = f.votes > 0
        few = has and (math.isnan(f.up_low) or math.isnan(f.up_high))
        label = f"{100 * f.up_rate:.0f}% ({f.vote_chats} chats)" if has else "no votes"
        if few:
            intervals.append(
                Interval(
                    name=f.name + (" (control)" if f.control else ""),
                    x=round(LEFT + (i + 0.5) * slot, 1),
                    y=_y(100 * f.up_rate, 100),
                    y_low=_y(100 * f.up_rate, 100),
                    y_high=_y(100 * f.up_rate, 100),
                    control=f.control,
                    served=f.served,
                    label=f"{label}, too few for an interval",
                )
            )
            continue
        intervals.append(
            Interval(
                name=f.name + (" (control)" if f.control else ""),
                x=round(LEFT + (i + 0.5) * slot, 1),
                y=_y(100 * f.up_rate, 100) if has else None,
                y_low=_y(100 * f.up_low, 100) if has else _y(0, 100),
                y_high=_y(100 * f.up_high, 100) if has else _y(100, 100),
                control=f.control,
                served=f.served,
                label=label,
            )
        )
    base = report.get(report.control)
    return IntervalChart(
        title=(
            f"Thumbs-up rate per variant, 95% chat-level interval (experiment {report.experiment})"
        ),
        intervals=intervals,
        ticks=[Tick(_y(t, 100), f"{t:g}%") for t in range(0, 101, 20)],
        control_y=_y(100 * base.up_rate, 100) if base is not None and base.votes else None,
        width=width,
    )
