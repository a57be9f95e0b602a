"""The overview's chart of the last 24 hours: inline SVG (presentation/svg.py draws the app's
charts; this lays out the overview's), accepted requests above the axis and refused
ones below, each column with a <title> for hover."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..presentation.display import duration_text
from ..presentation.svg import compact_count, join
from ..watch.traffic import ActivityBucket

BAR = 3  # px per bucket, the last one a gap
LEFT = 46  # room for the scale's labels
RIGHT = 16  # room for half a time label ("21:00") centred on the last column
UP = 54  # accepted bars grow up from the axis…
DOWN = 22  # …rejected ones down from it, each on its own scale
TOP, LABELS = 6, 16


def chart_svg(buckets: list[ActivityBucket]) -> SafeString:
    """Accepted requests as blue bars above the axis, rejected ones as orange bars below
    it (position tells them apart as well as colour), one column per bucket, each with
    a <title>; time labels every 3 hours."""
    width = LEFT + BAR * len(buckets) + RIGHT
    base = TOP + UP
    height = base + DOWN + LABELS + 2
    most_ok = max((b.accepted for b in buckets), default=0)
    most_bad = max((b.rejected for b in buckets), default=0)
    size = buckets[1].start - buckets[0].start if len(buckets) > 1 else timedelta(minutes=5)
    parts: list[str] = []
    for i, b in enumerate(buckets):
        x = LEFT + i * BAR
        if b.accepted:
            h = max(1, round(UP * b.accepted / most_ok))
            parts.append(format_html(_RECT, x, base - h, BAR - 1, h, "wr-ok-bar"))
        if b.rejected:
            h = max(1, round(DOWN * b.rejected / most_bad))
            parts.append(format_html(_RECT, x, base + 1, BAR - 1, h, "wr-bad-bar"))
        start = timezone.localtime(b.start)
        if start.minute == 0 and start.hour % 3 == 0:
            parts.append(
                format_html(_TICK, x, TOP, x, base + DOWN, x, height - 3, f"{start:%H:%M}")
            )
        # the whole column answers hover, not only the (thin, maybe absent) bars
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="{}" height="{}" class="wr-hover">'
                "<title>{}–{}: {} accepted, {} rejected</title></rect>",
                x,
                TOP,
                BAR,
                UP + DOWN + 1,
                f"{start:%H:%M}",
                f"{timezone.localtime(b.start + size):%H:%M}",
                b.accepted,
                b.rejected,
            )
        )
    # the scale's labels in at most four characters ("24k"), so that they fit the room
    # left of the axis whatever the counts; the exact count is the label's <title>
    busiest = f"in the busiest {duration_text(size)}"
    scale = format_html(
        '<text x="{}" y="{}" class="wr-scale">{} ▲<title>{} accepted {}</title></text>'
        '<text x="{}" y="{}" class="wr-scale">{} ▼<title>{} rejected {}</title></text>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="wr-axis"/>',
        LEFT - 4,
        TOP + 9,
        compact_count(most_ok),
        most_ok,
        busiest,
        LEFT - 4,
        base + DOWN,
        compact_count(most_bad),
        most_bad,
        busiest,
        LEFT,
        base + 0.5,
        width - RIGHT,
        base + 0.5,
    )
    empty = (
        format_html(
            '<text x="{}" y="{}" class="wr-empty">no requests in these 24 hours</text>',
            LEFT + BAR * len(buckets) // 2,
            base - 12,
        )
        if not most_ok and not most_bad
        else ""
    )
    return format_html(
        '<svg class="wr-chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="accepted and rejected requests per {} over the last 24 hours">'
        "{}{}{}</svg>",
        width,
        height,
        width,
        height,
        duration_text(size),
        scale,
        join(parts),
        empty,
    )


_RECT = '<rect x="{}" y="{}" width="{}" height="{}" class="{}"/>'
_TICK = (
    '<line x1="{}" y1="{}" x2="{}" y2="{}" class="wr-tick"/>'
    '<text x="{}" y="{}" class="wr-time">{}</text>'
)
