"""How values look in the admin's lists and pages: stored text kept as it came but
wrapping, stacked lines in one cell, compact and full times, and the trace links."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe


def trace_url(source: str, event_key: str) -> str:
    """The trace page of one event key: every delivery, the receipt, the effects, the
    failed-event history."""
    query = urlencode({"source": source, "key": event_key})
    return f"{reverse('admin:webhook_receiver_trace')}?{query}"


def trace_link(source: str, event_key: str) -> str:
    if not event_key:
        return "-"
    return format_html('<a href="{}">trace</a>', trace_url(source, event_key))


def pre(text: str) -> str:
    """Stored text as it came, its lines kept; a value of thousands of characters with no
    space wraps anywhere rather than widen the page."""
    return format_html(
        '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; margin: 0">{}</pre>', text
    )


def wrap_words(text: str) -> str:
    """A break allowed after each dot, colon and underscore: event types and keys wrap
    between their words in a narrow column."""
    words = re.split(r"(?<=[._:])", text)
    return format_html_join(mark_safe("<wbr>"), "{}", ((w,) for w in words)) or "-"


def stacked_lines(lines: list[tuple[str, str, datetime | None]]) -> str:
    """(text, CSS class, moment) a line each, stacked in one cell; a moment's full time
    is the line's title."""
    return format_html_join(
        "",
        '<span class="wr-line {}" title="{}">{}</span>',
        ((css, full_time(moment) if moment else "", text) for text, css, moment in lines),
    )


def full_time(moment: datetime) -> str:
    return timezone.localtime(moment).isoformat(sep=" ", timespec="seconds")


def compact_time(moment: datetime) -> str:
    """ "14:05:09" today, "Nov 30 14:05" on another day: narrow enough for the list."""
    local = timezone.localtime(moment)
    if local.date() == timezone.localdate():
        return f"{local:%H:%M:%S}"
    return f"{local:%b %d %H:%M}"


def moment_cell(moment: datetime | None, empty: str = "-") -> str:
    """A compact time, the full one in its title."""
    if moment is None:
        return empty
    return format_html('<span title="{}">{}</span>', full_time(moment), compact_time(moment))


def history_html(entries: Any, row: str, keys: Sequence[str], missing: str = "") -> str:
    """A stored JSON list of records (an error history, an action history) as ``row``
    (a format_html string) per record, filled with the values of ``keys``: ``missing``
    for the first key a record lacks, "" for the others; "-" when there are none."""
    records = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    if not records:
        return "-"
    values = (
        tuple(e.get(key, missing if n == 0 else "") for n, key in enumerate(keys)) for e in records
    )
    return format_html_join("", row, values)
