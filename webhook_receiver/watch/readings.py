"""The status is made of readings (the source records, receipts, failed events, the
outbox, the heartbeat, …), each bounded on its own: a table locked by another session
costs the readings of that table their bound (STATUS_TIMEOUT_SECONDS) and nothing else.
What could be read is shown; what could not is named by what it is ("receipts: locked,
not read within 3 s"), and the verdict is never OK with a part unread.

On PostgreSQL, ``locked_tables`` first looks, within one bound, for the app's tables
that another session holds ACCESS EXCLUSIVE (LOCK TABLE, a migration, VACUUM FULL): such
a table is named, and the readings of it are not tried, so that a lock costs the status
one bound, not one per reading (and any number of locks, one bound in all).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.apps import apps
from django.db import DatabaseError, connection
from django.db.models import Model

from ..core.bounds import NotAnswering, database_deadline

T = TypeVar("T")


@dataclass(frozen=True)
class Unread:
    """A part of the status that could not be read: what it is, and why."""

    what: str
    why: str
    # the locked tables that kept it unread, when known
    tables: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.what}: {self.why}"

    def as_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}


def app_tables() -> list[type[Model]]:
    """The app's tables (its concrete models), in a stable order."""
    config = apps.get_app_config("webhook_receiver")
    return [
        m
        for m in config.get_models(include_auto_created=True)
        if m._meta.managed and not m._meta.proxy
    ]


class Readings:
    """Reads each part of a status within ``seconds``, remembering what it could not
    read. ``read`` returns the part, or ``default`` when it could not be read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.unread: list[Unread] = []
        self._locked: set[str] = set()  # tables found locked
        self._failed: dict[str, Unread] = {}
        # why no connection could be had: each reading would wait its connect timeout
        # for the same answer, so the rest are not tried
        self._unreachable: str | None = None

    def tables_probe(self, models: Iterable[type[Model]] | None = None) -> list[str]:
        """Find which of ``models``' tables (by default the app's) are locked, within
        the bound; the readings of them are then not tried (PostgreSQL; nothing
        elsewhere)."""
        try:
            locked = locked_tables(app_tables() if models is None else models, self.seconds)
        except DatabaseError as exc:  # the readings name it (at once, with no connection)
            self._note_unreachable(exc)
            return []
        self._locked.update(locked)
        return locked

    def locked_unread(self) -> None:
        """Name each locked table that no reading named (one the status does not read,
        such as the delivery attempts, which the relay writes): it is still a part of
        the app that does not work."""
        named = {t for u in self.unread for t in u.tables}
        for table in sorted(self._locked - named):
            self._unread(table, f"locked, not read within {self.seconds:g} s", None)

    def read(self, what: str, models: Iterable[type[Model]], fn: Callable[[], T], default: T) -> T:
        """``fn()`` within the bound, or ``default``, ``what`` then named unread."""
        tables = [m._meta.db_table for m in models]
        if what in self._failed:
            return default
        if self._unreachable is not None:
            return self._unread(what, self._unreachable, default)
        held = tuple(t for t in tables if t in self._locked)
        if held:
            why = f"locked ({', '.join(held)}), not read within {self.seconds:g} s"
            return self._unread(what, why, default, held)
        try:
            with database_deadline(self.seconds):
                return fn()
        except DatabaseError as exc:  # NotAnswering too
            self._note_unreachable(exc)
            return self._unread(what, unread_reason(exc), default)

    def _note_unreachable(self, exc: DatabaseError) -> None:
        if connection.connection is None:  # the connection itself failed
            self._unreachable = unread_reason(exc)

    def _unread(self, what: str, why: str, default: T, tables: tuple[str, ...] = ()) -> T:
        unread = Unread(what, why, tables)
        self._failed[what] = unread
        self.unread.append(unread)
        return default

    def failed(self, what: str) -> bool:
        return what in self._failed


def read_unbounded(what: str, models: Iterable[type[Model]], fn: Callable[[], T], default: T) -> T:
    """``Readings.read``'s signature without its bounds, for a caller with no
    ``Readings``: ``fn()``, whose database errors raise."""
    return fn()


# Another session's ACCESS EXCLUSIVE lock on these tables (as the search path finds
# them, in this database: pg_locks shows every database's), held or queued for (a queued
# one makes every later reader wait behind it): the only mode a read waits for.
BLOCKING = """
    SELECT DISTINCT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
    WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.pid <> pg_backend_pid()
      AND l.relation = ANY(SELECT to_regclass(name) FROM unnest(%s::text[]) AS name)
"""
# how often a lock is looked at again while the bound lasts
POLL_SECONDS = 0.1


def locked_tables(models: Iterable[type[Model]], seconds: float) -> list[str]:
    """The tables of ``models`` that another session has held locked against reads
    (ACCESS EXCLUSIVE: LOCK TABLE, a migration, VACUUM FULL) for ``seconds``: read from
    pg_locks, which takes no lock, again every POLL_SECONDS until none is or the bound
    is spent. One query when nothing is locked. PostgreSQL only ([] elsewhere: SQLite
    has no table locks, its readings' own errors say when the file is locked)."""
    if connection.vendor != "postgresql":
        return []
    tables = [connection.ops.quote_name(m._meta.db_table) for m in models]
    deadline = time.monotonic() + seconds
    with database_deadline(seconds), connection.cursor() as cursor:
        while True:
            cursor.execute(BLOCKING, [tables])
            held = sorted(name for (name,) in cursor.fetchall())
            left = deadline - time.monotonic()
            if not held or left <= POLL_SECONDS:
                return held
            time.sleep(POLL_SECONDS)


def unread_reason(exc: BaseException) -> str:
    """Why a reading failed: "locked, not read within 3 s", "database not answering
    within 3 s" (a statement too slow), or the database error's name."""
    if isinstance(exc, NotAnswering):
        if exc.locked:
            return f"locked, not read within {exc.seconds:g} s"
        return str(exc)
    # the driver's own class names the fault (UndefinedTable), Django's only its kind
    return f"database error ({type(exc.__cause__ or exc).__name__})"
