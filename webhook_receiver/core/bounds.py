"""Statement bounds: no statement waits for a lock or runs for longer than it may.

A statement waits at most ``lock_timeout`` for a lock and runs at most
``statement_timeout``. PostgreSQL takes a statement's table locks before it runs any of
it, so bounds set inside a statement come too late for that statement's own locks: they
are set by a statement of their own, sent with the statement they bound in one round
trip (``execute_bounded``). They are local to the transaction (``set_config(…, true)``),
so nothing outlives it on a connection that a pooler hands to someone else next.

A tool that must answer within seconds (``database_deadline``) reads under bounds of its
own and says ``NotAnswering`` when one fires.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper

from ..conf import app_settings

# The bounds of the current transaction (or, outside one, of the statement sent with it),
# from the parameters ``lock_timeout`` and ``statement_timeout`` (bounds_params); the
# values set are returned only to be ignored.
BOUND = """
    SELECT set_config('lock_timeout', %(lock_timeout)s, true),
           set_config('statement_timeout', %(statement_timeout)s, true)
"""


def bounds_params(*, lock_timeout_ms: int, statement_timeout_ms: int) -> dict[str, str]:
    """BOUND's parameters, as set_config takes them (0: no limit)."""
    return {
        "lock_timeout": f"{lock_timeout_ms}ms",
        "statement_timeout": f"{statement_timeout_ms}ms",
    }


def configured_bounds() -> dict[str, str]:
    """BOUND's parameters for LOCK_TIMEOUT_MS and STATEMENT_TIMEOUT_MS: a delivery's
    bounds, which a failure's capture, a retry, a refusal's record and the relay share."""
    config = app_settings()
    return bounds_params(
        lock_timeout_ms=config.lock_timeout_ms, statement_timeout_ms=config.statement_timeout_ms
    )


def transaction_bound(params: Mapping[str, str] | None = None) -> None:
    """Bound the rest of the current transaction by ``params`` (bounds_params; by default
    the configured bounds), in a statement of its own (PostgreSQL; off the hot path, where
    a round trip more does not matter)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(BOUND, configured_bounds() if params is None else params)


@contextlib.contextmanager
def bounded_transaction(*, savepoint: bool = False) -> Iterator[None]:
    """A transaction whose statements are bounded on PostgreSQL by LOCK_TIMEOUT_MS and
    STATEMENT_TIMEOUT_MS, so that a locked table (a migration, VACUUM FULL) ends it within
    seconds instead of holding a worker. The bounds are local to the transaction (nothing
    stays on the session, as PgBouncer's transaction mode requires). Inside a caller's
    transaction it joins it (in a savepoint of its own with ``savepoint``) and leaves the
    bounds to the caller."""
    outermost = not connection.in_atomic_block
    with transaction.atomic(savepoint=savepoint):
        if outermost:
            transaction_bound()
        yield


class NotAnswering(DatabaseError):
    """The database did not answer within a status tool's bound: a lock it waited for,
    a statement that ran too long, or the bound spent before the next statement."""

    def __init__(self, seconds: float, *, locked: bool = False) -> None:
        self.seconds = seconds
        # the bound fired waiting for a table's lock (lock_timeout), not a slow statement
        self.locked = locked
        super().__init__(f"database not answering within {seconds:g} s")


# lock_not_available (lock_timeout), query_canceled (statement_timeout)
LOCK_TIMEOUT_STATE = "55P03"
TIMEOUT_STATES = frozenset({LOCK_TIMEOUT_STATE, "57014"})


@contextlib.contextmanager
def database_deadline(seconds: float) -> Iterator[None]:
    """Run the block's reads in one transaction in which no statement waits for a lock
    or runs longer than ``seconds``, and none starts once ``seconds`` have passed, for a
    tool that must answer within seconds, if only to say that it could not look
    (webhook_status, /health/). A timeout raises NotAnswering."""
    deadline = time.monotonic() + seconds

    def before_each(execute: Callable[..., Any], *args: Any) -> Any:
        if time.monotonic() > deadline:
            raise NotAnswering(seconds)
        return execute(*args)

    milliseconds = max(1, int(seconds * 1000))
    try:
        with transaction.atomic(), connection.execute_wrapper(before_each):
            transaction_bound(
                bounds_params(lock_timeout_ms=milliseconds, statement_timeout_ms=milliseconds)
            )
            yield
    except NotAnswering:
        raise
    except DatabaseError as exc:
        state = sqlstate(exc)
        if state in TIMEOUT_STATES:
            raise NotAnswering(seconds, locked=state == LOCK_TIMEOUT_STATE) from exc
        raise


def bound_fired(exc: BaseException) -> bool:
    """``exc`` is a lock or statement timeout: a bound that fired."""
    return sqlstate(exc) in TIMEOUT_STATES


def execute_bounded(
    cursor: CursorWrapper,
    statement: str,
    params: Mapping[str, Any],
    *,
    bound: str = BOUND,
    restore: str | None = None,
) -> None:
    """Execute ``statement`` under the bounds ``bound`` sets (from the same ``params``),
    then ``restore``, if given, in one round trip on PostgreSQL; the results are
    ``statement``'s, as after ``cursor.execute``. Elsewhere ``statement`` alone (SQLite
    has its busy timeout instead).

    psycopg's pipeline mode sends them and one Sync together. Inside a transaction the
    bounds last until it ends, or until ``restore`` (a savepoint that rolls back undoes
    them); outside one, the statements form one implicit transaction, which ends at the
    Sync, bounds and all. Where libpq cannot pipeline (before 14), each statement costs
    a round trip.
    """
    if connection.vendor != "postgresql":
        cursor.execute(statement, params)
        return
    if not _pipeline_supported():
        _bounded(cursor, statement, params, bound, restore)
        return
    # the errors come out of the pipeline's end (its Sync), where Django's cursor does not
    # translate them: its wrapper does it here
    with connection.wrap_database_errors, connection.connection.pipeline():
        _bounded(cursor, statement, params, bound, restore)


def _bounded(
    cursor: CursorWrapper,
    statement: str,
    params: Mapping[str, Any],
    bound: str,
    restore: str | None,
) -> None:
    # A cursor's results are its last statement's: the bounds go first on the same one
    # (a cursor is not free on the hot path), and ``restore`` on a cursor of its own.
    cursor.execute(bound, params)
    cursor.execute(statement, params)
    if restore is not None:
        with connection.cursor() as settings:
            settings.execute(restore, params)


@functools.cache
def _pipeline_supported() -> bool:
    import psycopg  # PostgreSQL only: SQLite needs no driver of ours

    return psycopg.Pipeline.is_supported()


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
