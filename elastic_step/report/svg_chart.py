"""Line charts as inline SVG: axes with round ticks, series, event markers. No scripts.

Every text that reaches the SVG is escaped here; callers pass plain text.
Tests: tests/unit/test_report.py (the ticks, escaping, a report's charts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 520, 260
#: Space around the plot area for the title, tick labels and axis labels.
LEFT, RIGHT, TOP, BOTTOM = 60, 18, 30, 44
#: Marks drawn on the points of a series with at most this many points; smaller ones on
#: a series of more than ``SMALL_MARKS_ABOVE`` points, so the line stays visible.
MAX_MARKED_POINTS = 120
SMALL_MARKS_ABOVE = 30


@dataclass(frozen=True, kw_only=True)
class Point:
    x: float
    y: float
    #: Shown when the pointer rests on the point.
    tooltip: str = ""


@dataclass(frozen=True, kw_only=True)
class Series:
    name: str
    points: list[Point]
    color: str
    #: Hold each value until the next point (a count over time), instead of a straight line.
    step: bool = False
    marked: bool = True


@dataclass(frozen=True, kw_only=True)
class Event:
    """A moment marked by a vertical line, such as a restart."""

    x: float
    tooltip: str
    kind: str
    #: A short text over the line (an epoch's number); none by default.
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    events: list[Event] = field(default_factory=list)
    event_color: str = "#d62728"
    #: Fixed axis ranges; by default they are fitted to the points.
    x_range: tuple[float, float] | None = None
    y_range: tuple[float, float] | None = None
    integer_y: bool = False
    #: The y = x line, the ROC curve of a classifier that guesses.
    diagonal: bool = False
    width: int = WIDTH
    height: int = HEIGHT


def nice_ticks(low: float, high: float, *, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) covering [low, high]."""
    span = high - low
    step = 10 ** math.floor(math.log10(span / count))
    for multiple in (1, 2, 5, 10):
        if span / (step * multiple) <= count:
            step *= multiple
            break
    if integer:
        step = max(1.0, round(step))
    first = math.floor(low / step + 1e-9) * step
    ticks, tick = [], first
    while tick <= high + step * 1e-9:
        ticks.append(round(tick, 12))
        tick += step
    if ticks[-1] < high - step * 1e-9:
        ticks.append(round(tick, 12))
    return ticks


def _fitted(values: list[float], fixed: tuple[float, float] | None, integer: bool):
    """The axis range and ticks: ``fixed``, or the values' range widened to round ticks."""
    if fixed is not None:
        return fixed, nice_ticks(*fixed, integer=integer)
    low, high = min(values), max(values)
    if high == low:  # one value: give it room on both sides
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    ticks = nice_ticks(low, high, integer=integer)
    return (min(ticks[0], low), max(ticks[-1], high)), ticks


def _label(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) >= 1 else f"{value:.3g}"


def render_chart(chart: Chart, *, plot_id: str) -> str:
    """The chart as an ``<svg>`` element carrying ``data-plot="{plot_id}"``."""
    points = [p for s in chart.series for p in s.points if math.isfinite(p.x + p.y)]
    xs = [p.x for p in points] + [e.x for e in chart.events]
    (x_low, x_high), x_ticks = _fitted(xs or [0.0], chart.x_range, False)
    (y_low, y_high), y_ticks = _fitted(
        [p.y for p in points] or [0.0], chart.y_range, chart.integer_y
    )
    left, right = LEFT, chart.width - RIGHT
    top, bottom = TOP, chart.height - BOTTOM

    def sx(x: float) -> float:
        return round(left + (x - x_low) / (x_high - x_low) * (right - left), 2)

    def sy(y: float) -> float:
        return round(bottom - (y - y_low) / (y_high - y_low) * (bottom - top), 2)

    title = escape(chart.title)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-plot="{escape(plot_id)}" '
        f'width="{chart.width}" height="{chart.height}" '
        f'viewBox="0 0 {chart.width} {chart.height}" role="img" aria-label="{title}">',
        f"<title>{title}</title>",
        f'<text class="chart-title" x="{left}" y="18">{title}</text>',
        f'<rect class="plot-area" x="{left}" y="{top}" width="{right - left}" '
        f'height="{bottom - top}"/>',
    ]
    for y in y_ticks:
        if y_low <= y <= y_high:
            out.append(f'<line class="grid" x1="{left}" x2="{right}" y1="{sy(y)}" y2="{sy(y)}"/>')
            out.append(
                f'<text class="tick" x="{left - 6}" y="{sy(y) + 4}" '
                f'text-anchor="end">{escape(_label(y))}</text>'
            )
    for x in x_ticks:
        if x_low <= x <= x_high:
            out.append(
                f'<text class="tick" x="{sx(x)}" y="{bottom + 16}" '
                f'text-anchor="middle">{escape(_label(x))}</text>'
            )
    out.append(
        f'<text class="axis-label" x="{(left + right) / 2}" y="{chart.height - 8}" '
        f'text-anchor="middle">{escape(chart.x_label)}</text>'
    )
    out.append(
        f'<text class="axis-label" transform="translate(14 {(top + bottom) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(chart.y_label)}</text>'
    )
    if chart.diagonal:
        out.append(
            f'<line class="diagonal" x1="{sx(x_low)}" y1="{sy(y_low)}" '
            f'x2="{sx(x_high)}" y2="{sy(y_high)}"/>'
        )
    for series in chart.series:
        out.append(_render_series(series, sx, sy))
    for event in chart.events:  # over the series: a restart's line must not hide behind it
        x = sx(event.x)
        if event.label:
            marker = (
                f'<text class="tick" x="{x}" y="{top - 3}" text-anchor="middle" '
                f'fill="{chart.event_color}">{escape(event.label)}</text>'
            )
        else:
            marker = f'<path d="M{x - 5} {top - 8}h10l-5 8z" fill="{chart.event_color}"/>'
        out.append(
            f'<g class="event" data-kind="{escape(event.kind)}">'
            f"<title>{escape(event.tooltip)}</title>"
            f'<line x1="{x}" x2="{x}" y1="{top}" y2="{bottom}" stroke="{chart.event_color}"/>'
            f"{marker}</g>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _render_series(series: Series, sx, sy) -> str:
    points = [p for p in series.points if math.isfinite(p.x + p.y)]
    coordinates: list[tuple[float, float]] = []
    for point in points:
        if series.step and coordinates:
            coordinates.append((sx(point.x), coordinates[-1][1]))
        coordinates.append((sx(point.x), sy(point.y)))
    out = [f'<g class="series" data-series="{escape(series.name)}">']
    if len(coordinates) > 1:
        path = " ".join(f"{x},{y}" for x, y in coordinates)
        out.append(f'<polyline class="line" points="{path}" stroke="{series.color}"/>')
    if (series.marked and len(points) <= MAX_MARKED_POINTS) or len(points) == 1:
        radius = 2 if len(points) > SMALL_MARKS_ABOVE else 3.5
        for point in points:
            tooltip = f"<title>{escape(point.tooltip)}</title>" if point.tooltip else ""
            out.append(
                f'<circle cx="{sx(point.x)}" cy="{sy(point.y)}" r="{radius}" '
                f'fill="{series.color}">{tooltip}</circle>'
            )
    out.append("</g>")
    return "\n".join(out)
