"""Surviving outages: discard a session that cannot heal, and get through a dependency's
outage with one log line, not one a call.

A connection whose session went read-only (a failover, ``default_transaction_read_only``)
still answers Django's ``SELECT 1`` health check, so it would be kept and fail every
request until the worker restarts. One that the server shut down is no better. Such a
connection is closed after the failure, and the next request opens a fresh one.

A failing database fails every request the same way: each gets one line of
``logs.log_failure``, with a traceback only once in a while.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connection

from .bounds import sqlstate
from .logs import SaidOnce, error_name, log_failure, value_text

# SQLSTATEs after which the session itself is no good: read_only_sql_transaction,
# admin_shutdown, crash_shutdown, cannot_connect_now; and class 08, connection exceptions
BROKEN_SESSION_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})

T = TypeVar("T")


def connection_discard_if_broken(exc: BaseException) -> bool:
    """Close the connection when ``exc`` says its session cannot heal; return whether it
    was closed. Never inside a transaction: its owner decides then."""
    state = sqlstate(exc)
    broken = state is not None and (state in BROKEN_SESSION_STATES or state.startswith("08"))
    if broken and not connection.in_atomic_block:
        connection.close()
        return True
    return False


class Outage:
    """A dependency that the app can do without for a while (a cache, a broker): its
    failures are survived, and logged once an outage, not once a call (logs.SaidOnce).

    ``call(fn, default)`` returns ``fn()``, or ``default`` when it raises. The first
    failure logs one WARNING ("<name> not answering", the error, and what happens
    meanwhile); then,
    for ``RETRY_SECONDS``, calls return ``default`` without trying, so that a server
    that hangs rather than refuses costs one timeout a while, not one per call. The
    first call that works again logs one INFO line, with the outage's length and the
    calls done without it. Per process, without a lock: a race only doubles a line.
    """

    RETRY_SECONDS = 5.0

    def __init__(
        self, logger: logging.Logger, name: str, meanwhile: str, state: str = "not answering"
    ) -> None:
        self.logger = logger
        self.name = name
        self.meanwhile = meanwhile
        self.state = state
        # the outage, once it is on: its stretch counts the calls done without the
        # dependency, the one that failed first excepted
        self.said = SaidOnce()
        self.retry_at = 0.0

    def call(self, fn: Callable[[], T], default: T) -> T:
        if self.resting():
            return default
        try:
            result = fn()
        except Exception as exc:
            self.failed(exc)
            return default
        self.answered()
        return result

    def resting(self) -> bool:
        """Whether the outage is on and the next try not yet due (a call is then done
        without the dependency, and counted)."""
        if None in self.said.stretches and time.monotonic() < self.retry_at:
            self.said.met()
            return True
        return False

    def failed(self, exc: BaseException) -> None:
        """A call failed with ``exc``: the outage's WARNING line if it starts here."""
        now = time.monotonic()
        if self.said.met(now=now):
            self.logger.warning(
                "%s %s: %s: %s; %s",
                self.name,
                self.state,
                error_name(exc),
                value_text(str(exc).splitlines()[0] if str(exc) else ""),
                self.meanwhile,
            )
        self.retry_at = now + self.RETRY_SECONDS

    def answered(self) -> None:
        """A call worked: the outage's INFO line if one was on."""
        outage = self.said.stretches.pop(None, None)
        if outage is not None:
            self.logger.info(
                "%s works again after %.1f s (%d calls done without it)"
                if self.state != "not answering"
                else "%s answers again after %.1f s (%d calls done without it)",
                self.name,
                time.monotonic() - outage.since,
                outage.repeats + 1,
            )


def tolerates_database_errors(task: Callable[..., Any]) -> Callable[..., Any]:
    """For Celery tasks: a database error is one line (its traceback once in a while,
    log_failure), not Celery's traceback for every run of a periodic task through an
    outage; the next run (beat's, or a sweep's) tries again. A session the error left
    unusable (read-only, shut down) is closed, so that the next run opens a fresh one
    (connection_discard_if_broken)."""
    logger = logging.getLogger(task.__module__)
    name = task.__name__.removesuffix("_task")  # the name it is registered and scheduled by

    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except DatabaseError as exc:
            connection_discard_if_broken(exc)
            log_failure(logger, f"task {name} failed; its next run tries again", exc)
            return None

    return run
