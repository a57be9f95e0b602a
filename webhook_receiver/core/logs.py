"""Log lines an operator reads at 3 am: one line per thing that happened, ``what: key=value
…``, the values escaped so that a peer cannot forge a line, and a traceback only the
first time an error class is met in ``TRACEBACK_INTERVAL_SECONDS`` (per process), so that
an outage cannot flood the logs.

Whatever lasts is said once a stretch, by ``SaidOnce``: when it starts, and (for a
condition that ends, an outage) when it ends, not every time it is met.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import storable

if TYPE_CHECKING:
    from django.http.response import HttpResponseBase

TRACEBACK_INTERVAL_SECONDS = 300.0

R = TypeVar("R", bound="HttpResponseBase")


@dataclass
class Stretch:
    """A condition met again and again: since when (time.monotonic), and how many times
    it was met since without being said."""

    since: float
    repeats: int = 0


class SaidOnce:
    """What has been said lately, so that a condition that lasts (an outage, a flood of
    refusals, an error class failing every request) is said once a stretch, not each
    time it is met. ``met(key)`` answers True when the condition starts a stretch (say
    it), else counts it in the stretch. A condition that ends (a dependency answers
    again) pops its stretch from ``stretches`` and says how long it lasted; with
    ``every`` (seconds), a stretch also ends by itself that long after it began, so that
    what lasts is said again now and then.

    Keys tell conditions apart (an error class, a source and a reason); ``None`` serves
    one that is the only one. ``stretches`` is a plain dict so that the usual case, no
    stretch on, costs a lookup and no call. Per process, without a lock: a race only
    doubles a line."""

    def __init__(self, every: float = math.inf) -> None:
        self.every = every
        self.stretches: dict[Hashable, Stretch] = {}

    def met(self, key: Hashable = None, *, now: float | None = None) -> bool:
        """The condition ``key`` is met ``now`` (time.monotonic() unless given, in
        seconds): whether it starts a stretch, to be said."""
        now = time.monotonic() if now is None else now
        stretch = self.stretches.get(key)
        if stretch is None or now - stretch.since >= self.every:
            self.stretches[key] = Stretch(now)
            return True
        stretch.repeats += 1
        return False

    def clear(self) -> None:
        """Forget every stretch: the next time each condition is met, it is said."""
        self.stretches.clear()


# error classes whose traceback was logged lately
_tracebacks_shown = SaidOnce(every=TRACEBACK_INTERVAL_SECONDS)


def tracebacks_shown_forget() -> None:
    """Forget which error classes had their traceback logged lately, so that the next
    failure of each logs its traceback again (a test that expects one)."""
    _tracebacks_shown.clear()


def error_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def error_line(exc: BaseException) -> str:
    """The error's class and first line: PostgreSQL's DETAIL and CONTEXT lines may quote
    the values (a peer's answer) that could not be stored."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def log_failure(logger: logging.Logger, what: str, exc: BaseException, **fields: Any) -> None:
    """Log one line: ``what``, the error, and ``fields`` as key=value (values escaped, so
    that a sender cannot forge lines); with the traceback only the first time this error
    class is met in a while."""
    name = error_name(exc)
    show = _tracebacks_shown.met(name)
    pairs = " ".join(f"{key}={value_text(value)}" for key, value in fields.items())
    logger.error(
        "%s: %s: %s %s%s",
        what,
        name,
        value_text(str(exc).splitlines()[0] if str(exc) else ""),
        pairs,
        "" if show else " (traceback logged earlier)",
        exc_info=exc if show else None,
        extra={"webhook": {**fields, "error": name}},
    )


def log_line(logger: logging.Logger, level: int, what: str, **fields: Any) -> None:
    """Log one line: ``what: key=value …``, the values escaped as log_failure's."""
    pairs = " ".join(f"{key}={value_text(value)}" for key, value in fields.items())
    logger.log(level, "%s: %s", what, pairs, extra={"webhook": fields})


def mark_logged(response: R) -> R:
    """``response``, marked as logged: Django's ``django.request`` logger would log every
    4xx and 5xx again, a bare "Service Unavailable: /webhooks/shop/" without the event's
    key, after the app's own line that has it."""
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's own mark
    return response


def value_text(value: Any) -> str:
    """A value for a ``key=value`` line: control characters escaped (storable.text), then
    backslashes and quotes, then whatever else could break or fake a line (U+2028, a
    no-break space); quoted when it holds a space or a quote, or is empty."""
    if value is None:
        return "-"
    text = storable.text(str(value), 300).replace("\\", "\\\\").replace('"', '\\"')
    if not text.isprintable():
        text = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
    return f'"{text}"' if (" " in text or '"' in text or not text) else text
