"""What is shown to people (and to machines): a peer's stored text made fit for showing,
and the app's own words for durations, counts and moments.

A peer's text is shown as it came, except for what would mislead whoever reads it: a
bidirectional control that reorders the text around it ("refund.\\u202edeunissi\\u202c.ok"
reads "refund.issinued.ok"), a zero-width character hidden inside a word, a control
character that moves a terminal's cursor, a lone surrogate that no page can encode. Each
is shown as its escape (``\\u202e``), the notation storable.py uses for what a column
cannot hold. Only what is shown changes: stored values, keys and links stay as they came.

The admin applies ``visible_html`` to every page of its records (admin/base.py); the
terminal commands apply ``visible`` to each value they print. Stored JSON is printed
through ``body_text`` and ``json_text``, which answer for any bytes and any depth.

Durations, counts and moments are worded the same on every page, command, notice and
machine-readable report (``duration_text``, ``ago_text``, ``top_counts``,
``local_time``; ``iso`` and ``seconds`` for a machine): a chart's axis and the evaluation
report's measurements too, through ``duration_text(precise=True)``. A counted noun goes
through Django's ``ngettext`` where it is written, as the admin's do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.functional import lazy
from django.utils.translation import gettext, ngettext

from ..conf.masked import url_masked as url_masked  # the one rule, re-exported for pages
from ..core import storable

# Format characters (Unicode category Cf: the bidirectional controls U+202A-202E,
# U+2066-2069, U+200E/200F and U+061C among them, the zero-width ones, the tags),
# control characters (Cc) but newline and tab, the line and paragraph separators (Zl,
# Zp) and surrogates (Cs), as of Unicode 15.1. tests/core/test_display.py checks
# the class against the running Python's own tables.
INVISIBLE = re.compile(
    "["
    "\x00-\x08\x0b-\x1f\x7f-\x9f\xad"
    "\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    "\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
    "]"
)

# what a page's forms post back, left as it is so that a form submits the stored value
# (the trace page's key), not its escape: value attributes (Django quotes every attribute
# with ", and escapes " in text, so a raw one is always markup) and a textarea's text
_FORM_VALUES = re.compile(r'(\svalue="[^"]*"|<textarea\b.*?</textarea>)', re.IGNORECASE | re.DOTALL)


def _escaped(match: re.Match[str]) -> str:
    return storable.escape(match.group())


def visible(text: str) -> str:
    """``text`` with each invisible character (INVISIBLE) shown as its escape."""
    if text.isprintable():  # the usual case, at C speed
        return text
    return INVISIBLE.sub(_escaped, text)


def visible_html(page: str) -> str:
    """A rendered page with every invisible character it shows escaped: in its text and
    its attributes (a title), but not in the values its forms post back. The escapes
    are letters, digits and backslashes, so the markup is unchanged."""
    if not INVISIBLE.search(page):
        return page
    parts = _FORM_VALUES.split(page)
    # split() puts the form values at the odd positions
    return "".join(part if n % 2 else visible(part) for n, part in enumerate(parts))


def body_text(raw: bytes) -> str:
    """A stored body: indented when it is JSON, else as it came (bytes that are not
    UTF-8 replaced by U+FFFD). JSON nested deeper than Python recurses is shown as it
    came, which needs no parsing."""
    try:
        return json.dumps(json.loads(raw), indent=2, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return raw.decode("utf-8", "replace")


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """A stored JSON value (an outcome, a payload, what a sender said), indented with its
    keys sorted. A value nested deeper than the encoder can recur from where it is called
    (a page renders deep in the stack) is printed on one line without recursion."""
    try:
        return json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False)
    except RecursionError:
        return _flat_json(value)


class _Markup(str):
    """A piece of JSON syntax waiting on _flat_json's stack (not a value to encode)."""


def _flat_json(value: Any) -> str:
    """``json.dumps(value, sort_keys=True)`` with an explicit stack instead of recursion:
    any depth, in time and memory linear in the value's size."""
    parts: list[str] = []
    todo: list[Any] = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, _Markup):
            parts.append(node)
        elif isinstance(node, dict) and node:
            # pushed in reverse: the last pushed is the first written
            items = sorted(node.items(), reverse=True)
            todo.append(_Markup("}"))
            for n, (name, item) in enumerate(items):
                todo.append(item)
                separator = "" if n == len(items) - 1 else ", "
                todo.append(_Markup(separator + json.dumps(str(name), ensure_ascii=False) + ": "))
            todo.append(_Markup("{"))
        elif isinstance(node, list) and node:
            todo.append(_Markup("]"))
            for n, item in enumerate(reversed(node)):
                todo.append(item)
                if n != len(node) - 1:
                    todo.append(_Markup(", "))
            todo.append(_Markup("["))
        else:  # a scalar, {} or []
            parts.append(json.dumps(node, ensure_ascii=False))
    return "".join(parts)


def answer_shown(
    status_code: int | None, error: str, *, hidden: Callable[[str], str] | None = None
) -> str:
    """What a destination last answered, as the admin's and the portal's pages show it:
    "HTTP 503: upstream unavailable"; with no status code, the app's own account of why
    there was no answer ("ConnectError: …"), never hidden. With ``hidden`` (for whoever
    may not read what a merchant's server wrote), "HTTP 503 (412 bytes, hidden)": the
    words ``hidden(error)`` says in place of its text."""
    text = " ".join(error.split())
    if status_code is None:
        return text
    if not text:
        return f"HTTP {status_code}"
    if hidden is not None:
        return f"HTTP {status_code} ({hidden(error)})"
    return f"HTTP {status_code}: {text}"


def duration_text(delta: timedelta, *, precise: bool = False) -> str:
    """A duration as a person reads it at a glance: "45 s", "20 min", "2 h 05 min",
    "3 d 4 h", each part cut down to its unit. ``precise`` for a measurement (a latency
    in a report, a chart's axis): three significant digits under a minute ("0.25 s",
    "4.2 s"), the seconds under an hour ("3 min 05 s"), rounded, and a last part that is
    zero left out ("2 min", "1 h"). Each unit goes through ngettext, in the language
    active when it is called: a text built at import uses duration_text_lazy."""
    total = max(0.0, delta.total_seconds())
    if precise and float(f"{total:.3g}") < 60:
        count = f"{round(total, 3):.3g}"  # "0.25", "4.2", "45"; never "1e-05"
        return ngettext("%(count)s s", "%(count)s s", round(total)) % {"count": count}
    seconds = round(total) if precise else int(total)
    if seconds < 60:
        return _seconds(seconds)
    minutes, seconds = divmod(seconds, 60)
    if precise and minutes < 60:
        return _then(_minutes(minutes), _seconds_two_digits(seconds) if seconds else "")
    if minutes < 60:
        return _minutes(minutes)
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        if precise and not minutes:
            return _hours(hours)
        return _then(_hours(hours), _minutes_two_digits(minutes))  # "2 h 05 min"
    days, hours = divmod(hours, 24)
    return _then(_days(days), _hours(hours) if hours or not precise else "")


def _then(first: str, second: str) -> str:
    return f"{first} {second}" if second else first


# each unit in words, its literal msgid where makemessages finds it
def _seconds(count: int) -> str:
    return ngettext("%(count)d s", "%(count)d s", count) % {"count": count}


def _seconds_two_digits(count: int) -> str:
    return ngettext("%(count)02d s", "%(count)02d s", count) % {"count": count}


def _minutes(count: int) -> str:
    return ngettext("%(count)d min", "%(count)d min", count) % {"count": count}


def _minutes_two_digits(count: int) -> str:
    return ngettext("%(count)02d min", "%(count)02d min", count) % {"count": count}


def _hours(count: int) -> str:
    return ngettext("%(count)d h", "%(count)d h", count) % {"count": count}


def _days(count: int) -> str:
    return ngettext("%(count)d d", "%(count)d d", count) % {"count": count}


def ago_text(age: timedelta) -> str:
    """How long ago, in words: "42 min ago"; a moment still to come (a retry's next
    attempt), "in 20 min"."""
    if age < timedelta(0):
        return gettext("in %(age)s") % {"age": duration_text(-age)}
    return gettext("%(age)s ago") % {"age": duration_text(age)}


# for a text built at import, before a language is active (and before apps are ready)
duration_text_lazy = lazy(duration_text, str)


def top_counts(counts: Mapping[str, int], shown: int = 3) -> str:
    """'invalid_signature: 10, timestamp_out_of_tolerance: 2', largest first."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{code}: {n}" for code, n in ordered[:shown])
    return text + (", …" if len(ordered) > shown else "")


def local_time(moment: datetime | None, empty: str = "never") -> str:
    """A moment to the second in the current time zone, named: "2026-12-02 14:05:09 UTC"."""
    if moment is None:
        return empty
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def iso(moment: datetime | None) -> str | None:
    """A moment for a machine (ISO 8601), or None."""
    return None if moment is None else moment.isoformat()


def seconds(delta: timedelta | None) -> float | None:
    """A duration for a machine, in seconds to the millisecond, or None."""
    return None if delta is None else round(delta.total_seconds(), 3)
