"""Log lines an operator reads at 3 am: one line per thing that happened, ``what: key=value
…``, the values escaped so that a peer cannot forge a line, and a traceback only the
first time an error class is met in ``TRACEBACK_INTERVAL_SECONDS`` (per process), so that
an outage cannot flood the logs.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any, TypeVar

from . import storable

if TYPE_CHECKING:
    from django.http.response import HttpResponseBase

TRACEBACK_INTERVAL_SECONDS = 300.0


_traceback_shown_at: dict[str, float] = {}


R = TypeVar("R", bound="HttpResponseBase")


def tracebacks_shown_forget() -> None:
    """Forget which error classes had their traceback logged lately, so that the next
    failure of each logs its traceback again (a test that expects one)."""
    _traceback_shown_at.clear()


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
    now = time.monotonic()
    show = now - _traceback_shown_at.get(name, -math.inf) >= TRACEBACK_INTERVAL_SECONDS
    if show:
        _traceback_shown_at[name] = now
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
