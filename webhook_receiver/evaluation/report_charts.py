"""A scenario's charts in the HTML report: the latency distribution, queue depth, the
oldest eligible message's age, messages held back for an operator and the limiter's
utilisation, one line (or outline) per destination in the same colour in each."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from ..presentation.svg import Chart, Series, colour, draw, join


def scenario_charts(i: int, s: dict[str, Any]) -> SafeString:
    """Four charts, five when messages were held back for an operator, one line (or
    outline) per destination in the same colour in each."""
    dests = s["metrics"]["destinations"]
    if not dests:
        return mark_safe('<p class="muted">No destination: no outbound queue to chart.</p>')
    names = [d["name"] for d in s["destinations"] if d["name"] in dests]
    duration = float(s["duration_s"])

    def series(pick: Any) -> list[Series]:
        return [Series(n, colour(k), pick(dests[n])) for k, n in enumerate(names)]

    def over_time(title: str, name: str, empty: str, **options: Any) -> Chart:
        """A chart of one of the metrics' time series, on the run's whole span."""
        return Chart(
            title,
            series(lambda m: m["series"][name]),
            x_label="simulated time",
            empty=empty,
            x_max=duration,
            **options,
        )

    figures = [
        (
            Chart(
                "Enqueue-to-delivery latency",
                series(lambda m: m["latency_histogram"]),
                x_label="latency",
                empty="nothing delivered",
                kind="histogram",
                y_whole=True,
            ),
            "How many delivered messages took how long, from the scheduled admission to "
            "the 2xx: 24 equal bins from 0 to each destination's slowest.",
        ),
        (
            over_time(
                "Queue depth (messages pending or sending)", "depth", "nothing queued", y_whole=True
            ),
            "The messages not yet delivered nor failed, the largest in each slice of "
            "simulated time.",
        ),
        (
            over_time(
                "Oldest eligible message's age",
                "oldest_age_s",
                "nothing waited while due",
                y_time=True,
            ),
            "How long the oldest message the relay could send (due, and not behind an "
            "older open one of its ordering key) had waited since its admission: a queue "
            "that falls behind climbs here. Messages held back for an operator are apart.",
        ),
        (
            over_time(
                "Limiter utilisation",
                "utilisation",
                "nothing sent",
                reference=1.0,
                reference_label="the configured rate (1.0)",
            ),
            "Requests started in each slice over what the rate allows in it; the dashed "
            "line is the rate. A burst may lift a slice above it; staying above it is "
            "overspending.",
        ),
    ]
    if any(dests[n]["held_back_max"] for n in names):
        # only when something waited for an operator: an empty chart says nothing
        figures.insert(
            3,
            (
                over_time(
                    "Held back for an operator", "held_back", "nothing held back", y_whole=True
                ),
                "Messages waiting behind a terminal message of their ordering key (strict "
                "order): they go once an operator retries or discards it, not before.",
            ),
        )
    return join(
        [
            format_html('<h3>Charts</h3><div class="charts" id="charts-{}">', i),
            *(
                format_html("<figure>{}<figcaption>{}</figcaption></figure>", draw(c), caption)
                for c, caption in figures
            ),
            mark_safe("</div>"),
        ]
    )
