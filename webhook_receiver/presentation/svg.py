"""Inline SVG charts drawn in Python, for the admin's overview (admin/chart.py lays out
its bars) and the evaluation's HTML report (line and histogram charts, below): no script
library, no network, so that a page or a report file reads anywhere (offline, attached
to a ticket). Every text drawn comes through ``format_html`` (names come from scenario
files a team writes); numbers are formatted here, durations by display.duration_text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe

from .display import duration_text

# one colour per destination, in order; no red (red means broken in the report)
PALETTE = ("#2f6db3", "#d98b1b", "#2a9a72", "#8a5fb0", "#5aa9d6", "#6b6b6b", "#a0773c")

WIDTH, HEIGHT = 640, 280
LEFT, RIGHT, BOTTOM = 58, 26, 34
TITLE_Y, LEGEND_Y = 18, 40
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def join(parts: Sequence[Any]) -> SafeString:
    """Concatenate markup; a plain string that slipped in is escaped, not trusted."""
    return mark_safe("".join(str(conditional_escape(p)) for p in parts))


def duration(seconds: float) -> str:
    """A time axis's label: "0.75 s", "45 s", "2 min", "2 min 30 s", "1 h 30 min"."""
    return duration_text(timedelta(seconds=seconds), precise=True)


def number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:.3g}"


def compact_count(count: int) -> str:
    """ "950", "2.4k", "24k", "1.2M": a count in at most four characters, rounded down
    (a scale's label: the exact count is beside it, in its title)."""
    for size, unit in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if count >= size:
            tenths = count * 10 // size
            whole, tenth = divmod(tenths, 10)
            return f"{whole}.{tenth}{unit}" if whole < 10 and tenth else f"{whole}{unit}"
    return str(count)


def ticks(top: float, *, time: bool, whole: bool = False) -> list[float]:
    """Four to eight round ticks from 0 to at least ``top``: 1-2-5 steps (whole numbers
    for counts), or for a time axis steps a clock reads (15 s, 1 m, 5 m, 1 h)."""
    top = top if top > 0 else (10.0 if time else 1.0)
    if time and top >= 4:
        step = next((s for s in TIME_STEPS if top / s <= 6), 0.0)
        if not step:
            step = 3600 * 6 * math.ceil(top / (3600 * 6 * 6))
    else:
        raw = top / 5
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
        step = max(1, round(step)) if whole else step
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 9) for i in range(count + 1)]


@dataclass(frozen=True)
class Series:
    """One destination's data: [x, y] points, drawn in its colour."""

    label: str
    colour: str
    points: Sequence[Sequence[float]]


@dataclass(frozen=True)
class Chart:
    """What a chart shows. ``kind`` is "line" (points joined) or "histogram" (points are
    [upper edge, count]: a step outline from 0, filled lightly). ``x_time`` and
    ``y_time`` say which axes are durations; ``y_whole``, that the y axis counts.
    ``reference`` draws a dashed line at that height (the limiter's rate). ``empty`` is
    said over the axes when every value is 0."""

    title: str
    series: Sequence[Series]
    x_label: str
    empty: str
    kind: str = "line"
    x_time: bool = True
    y_time: bool = False
    y_whole: bool = False
    x_max: float = 0.0
    reference: float | None = None
    reference_label: str = ""


def draw(chart: Chart) -> SafeString:
    """The chart as an <svg> element, sized by the page (viewBox), with its title, a
    legend, axes with round ticks, the data, and the ``empty`` text when all is zero."""
    legend, legend_rows = _legend(chart.series)
    top = LEGEND_Y + 14 * legend_rows + 8
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - top - BOTTOM
    xs = [p[0] for s in chart.series for p in s.points]
    ys = [p[1] for s in chart.series for p in s.points]
    has_data = any(y > 0 for y in ys)
    y_top = max([*ys, chart.reference or 0.0, 0.0])
    y_ticks = ticks(
        y_top * (1.08 if chart.reference else 1.0), time=chart.y_time, whole=chart.y_whole
    )
    x_ticks = ticks(max([chart.x_max, *xs, 0.0]), time=chart.x_time)
    x_span, y_span = x_ticks[-1] or 1.0, y_ticks[-1] or 1.0

    def px(x: float) -> float:
        return round(LEFT + plot_w * x / x_span, 1)

    def py(y: float) -> float:
        return round(top + plot_h - plot_h * y / y_span, 1)

    x_text = duration if chart.x_time else number
    y_text = duration if chart.y_time else number
    parts: list[object] = [
        format_html(
            '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>',
            WIDTH,
            HEIGHT,
            chart.title,
            chart.title,
        ),
        format_html('<text class="chart-title" x="{}" y="{}">{}</text>', 4, TITLE_Y, chart.title),
        legend,
    ]
    for t in y_ticks:
        parts.append(
            format_html(
                '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                LEFT + plot_w,
                py(t),
                py(t),
                LEFT - 6,
                py(t) + 4,
                y_text(t),
            )
        )
    for t in x_ticks:
        parts.append(
            format_html(
                '<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>',
                px(t),
                px(t),
                top + plot_h,
                top + plot_h + 4,
                px(t),
                top + plot_h + 17,
                x_text(t),
            )
        )
    parts.append(
        format_html(
            '<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<text class="axis-label" x="{}" y="{}" text-anchor="end">{}</text>',
            LEFT,
            LEFT + plot_w,
            top + plot_h,
            top + plot_h,
            LEFT,
            LEFT,
            top,
            top + plot_h,
            LEFT + plot_w,
            HEIGHT - 4,
            chart.x_label,
        )
    )
    if chart.reference is not None:
        parts.append(
            format_html(
                '<line class="reference" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                LEFT + plot_w,
                py(chart.reference),
                py(chart.reference),
                LEFT + plot_w - 4,
                py(chart.reference) - 4,
                chart.reference_label,
            )
        )
    shape = _histogram if chart.kind == "histogram" else _line
    for s in chart.series:
        if s.points:
            parts.append(shape(s, px, py))
    if not has_data:
        parts.append(
            format_html(
                '<text class="empty" x="{}" y="{}" text-anchor="middle">{}</text>',
                LEFT + plot_w / 2,
                top + plot_h / 2,
                chart.empty,
            )
        )
    parts.append(mark_safe("</svg>"))
    return join(parts)


def _legend(series: Sequence[Series]) -> tuple[SafeString, int]:
    """A swatch and a name per series, wrapped onto as many rows as the width needs."""
    parts: list[object] = []
    x, row = LEFT, 0
    for s in series:
        width = 22 + 7 * len(s.label) + 16
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, row = LEFT, row + 1
        y = LEGEND_Y + 14 * row
        parts.append(
            format_html(
                '<rect class="swatch" x="{}" y="{}" width="14" height="4" fill="{}"/>'
                '<text class="legend" x="{}" y="{}">{}</text>',
                x,
                y - 5,
                s.colour,
                x + 20,
                y,
                s.label,
            )
        )
        x += width
    return join(parts), row + 1


def _line(s: Series, px: Callable[[float], float], py: Callable[[float], float]) -> SafeString:
    points = " ".join(f"{px(x)},{py(y)}" for x, y in s.points)
    return format_html(
        '<polyline class="data" points="{}" stroke="{}"><title>{}</title></polyline>',
        points,
        s.colour,
        s.label,
    )


def _histogram(s: Series, px: Callable[[float], float], py: Callable[[float], float]) -> SafeString:
    path = [f"M{px(0)},{py(0)}"]
    for edge, count in s.points:
        path.append(f"V{py(count)}H{px(edge)}")
    path.append(f"V{py(0)}Z")
    return format_html(
        '<path class="data histogram" d="{}" stroke="{}" fill="{}"><title>{}</title></path>',
        "".join(path),
        s.colour,
        s.colour,
        s.label,
    )
