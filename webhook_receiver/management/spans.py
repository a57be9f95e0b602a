"""A span of time as the commands take it: ``90m``, ``2h``, ``1d`` (``webhook_recover``'s
"since 2h", ``webhook_portal_link``'s "expires in 1d")."""

from __future__ import annotations

import re
from datetime import timedelta

SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|min|h|d)\s*$")
SPAN_SECONDS = {"m": 60, "min": 60, "h": 3600, "d": 86400}
SPAN_EXAMPLES = "90m, 2h, 1d"


def parse_span(text: str) -> timedelta | None:
    """The span ``text`` says, or None when it is not one; OverflowError when it is too
    long for a timedelta."""
    span = SPAN.match(text)
    if span is None:
        return None
    return timedelta(seconds=float(span[1]) * SPAN_SECONDS[span[2]])
