"""When the database fails: discard a session that cannot heal, and log each failed
request on one line.

A connection whose session went read-only (a failover, ``default_transaction_read_only``)
still answers Django's ``SELECT 1`` health check, so it would be kept and fail every
request until the worker restarts. One that the server shut down is no better. Such a
connection is closed after the failure, and the next request opens a fresh one.

A failing database fails every request the same way: each gets one log line with the
fields of its audit record, and a traceback only the first time its error class is met
in ``TRACEBACK_INTERVAL_SECONDS`` (per process), so an outage cannot flood the logs.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, connection

from . import storable

# SQLSTATEs after which the session itself is no good: read_only_sql_transaction,
# admin_shutdown, crash_shutdown, cannot_connect_now; and class 08, connection exceptions
BROKEN_SESSION_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})
TRACEBACK_INTERVAL_SECONDS = 300.0

_traceback_shown_at: dict[str, float] = {}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the database error in ``exc``'s chain, if there is one."""
    for error in _chain(exc):
        state = getattr(error, "sqlstate", None)
        if state:
            return state
    return None


def connection_discard_if_broken(exc: BaseException) -> bool:
    """Close the connection when ``exc`` says its session cannot heal; return whether it
    was closed. Never inside a transaction: its owner decides then."""
    state = sqlstate(exc)
    broken = state is not None and (state in BROKEN_SESSION_STATES or state.startswith("08"))
    if broken and not connection.in_atomic_block:
        connection.close()
        return True
    return False


def error_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def log_failure(logger: logging.Logger, what: str, exc: BaseException, **fields: Any) -> None:
    """Log one line: ``what``, the error, and ``fields`` as key=value (values escaped, so
    that a sender cannot forge lines); with the traceback only the first time this error
    class is met in a while."""
    name = error_name(exc)
    now = time.monotonic()
    show = now - _traceback_shown_at.get(name, -math.inf) >= TRACEBACK_INTERVAL_SECONDS
    if show:
        _traceback_shown_at[name] = now
    pairs = " ".join(f"{key}={_value(value)}" for key, value in fields.items())
    logger.error(
        "%s: %s: %s %s%s",
        what,
        name,
        _value(str(exc).splitlines()[0] if str(exc) else ""),
        pairs,
        "" if show else " (traceback logged earlier)",
        exc_info=exc if show else None,
        extra={"webhook": {**fields, "error": name}},
    )


def _value(value: Any) -> str:
    if value is None:
        return "-"
    text = storable.text(str(value), 300).replace('"', '\\"')
    return f'"{text}"' if (" " in text or '"' in text or not text) else text


def healing(task: Callable[..., Any]) -> Callable[..., Any]:
    """For Celery tasks: a database error that leaves the worker's session unusable
    (read-only, shut down) closes that connection, so that the next run opens a fresh
    one (connection_discard_if_broken)."""

    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except DatabaseError as exc:
            connection_discard_if_broken(exc)
            raise

    return run
