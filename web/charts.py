"""A stacked bar chart as plain numbers for an SVG template: no JavaScript, no chart library."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date

# Colour-blind-safe (Okabe-Ito), then repeated; a series keeps its colour across days.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    plot_left: int
    plot_top: int
    plot_bottom: int
    plot_right: int
    bars: list[Bar]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    legend: list[tuple[str, str]]  # (colour, series name)

    @property
    def empty(self) -> bool:
        return not self.bars


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (an axis maximum)."""
    if value <= 0:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return step * power
    raise AssertionError("unreachable")


def short_number(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:g}{suffix}"
    return f"{value:g}"


def stacked_bars(
    days: list[date],
    series: dict[str, dict[date, int]],
    *,
    width: int = 760,
    height: int = 260,
    unit: str = "tokens",
) -> Chart:
    """One bar per day, one segment per series (in the order given), scaled to a nice maximum."""
    left, right, top, bottom = 56, width - 12, 12, height - 28
    plot_w, plot_h = right - left, bottom - top
    totals = [sum(values.get(day, 0) for values in series.values()) for day in days]
    top_value = nice_ceiling(max(totals, default=0))
    slot = plot_w / max(len(days), 1)
    bar_w = max(slot * 0.7, 1)
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}

    bars = []
    for i, day in enumerate(days):
        x = left + i * slot + (slot - bar_w) / 2
        y: float = bottom
        for name, values in series.items():
            value = values.get(day, 0)
            if not value:
                continue
            h = value / top_value * plot_h
            y -= h
            bars.append(
                Bar(
                    x=round(x, 2),
                    y=round(y, 2),
                    width=round(bar_w, 2),
                    height=round(h, 2),
                    color=colors[name],
                    title=f"{day.isoformat()} {name}: {value:,} {unit}",
                )
            )

    label_every = max(1, math.ceil(len(days) / 10))  # at most about ten date labels
    x_ticks = [
        Tick(position=round(left + i * slot + slot / 2, 2), label=day.strftime("%b %d"))
        for i, day in enumerate(days)
        if i % label_every == 0
    ]
    y_ticks = [
        Tick(position=round(bottom - f * plot_h, 2), label=short_number(f * top_value))
        for f in (0, 0.25, 0.5, 0.75, 1)
    ]
    legend = [(colors[name], name) for name in series]
    return Chart(width, height, left, top, bottom, right, bars, x_ticks, y_ticks, legend)


@dataclass(frozen=True)
class LabelledBar:
    label: str  # left of the bar
    value: str  # right of it
    bar: Bar
    text_y: float
    value_x: float


@dataclass(frozen=True)
class PerplexityChart:
    """Two horizontal bars (the adapter's perplexity and the base model's alone on the same
    eval set) and, once there is one, a mark at the reference and one at the gate's limit."""

    width: int
    height: int
    label_x: int
    bars: list[LabelledBar]
    reference_x: float | None
    limit_x: float | None
    axis_max: str
    reference_title: str
    limit_title: str


def perplexity_bars(
    adapter: float,
    base: float,
    *,
    reference: float | None = None,
    max_ratio: float | None = None,
    width: int = 420,
) -> PerplexityChart:
    """Bars scaled to a nice maximum over everything drawn; lower is better."""
    label_width, bar_h, gap, top = 70, 18, 8, 6
    limit = reference * max_ratio if reference is not None and max_ratio is not None else None
    drawn = [v for v in (adapter, base, reference, limit) if v is not None and math.isfinite(v)]
    axis = nice_ceiling(max(drawn, default=1))
    plot_w = width - label_width - 40

    def x_of(value: float) -> float:
        return round(label_width + min(value, axis) / axis * plot_w, 2)

    bars = []
    for i, (label, value, color) in enumerate(
        (("adapter", adapter, PALETTE[0]), ("base", base, PALETTE[1]))
    ):
        y = top + i * (bar_h + gap)
        end = x_of(value)
        bar = Bar(
            x=label_width,
            y=y,
            width=round(end - label_width, 2),
            height=bar_h,
            color=color,
            title=f"{label}: perplexity {value:.4g}",
        )
        bars.append(LabelledBar(label, f"{value:.4g}", bar, text_y=y + 13, value_x=end + 4))
    return PerplexityChart(
        width=width,
        height=top * 2 + 2 * bar_h + gap,
        label_x=label_width - 6,
        bars=bars,
        reference_x=None if reference is None else x_of(reference),
        limit_x=None if limit is None else x_of(limit),
        axis_max=short_number(axis),
        reference_title="" if reference is None else f"first evaluation: {reference:.4g}",
        limit_title="" if limit is None else f"gate limit: {limit:.4g} (x{max_ratio:g})",
    )
