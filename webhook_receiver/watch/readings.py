"""The status is made of readings (the source records, receipts, failed events, the
outbox, the heartbeat, …), each bounded on its own: a table locked by another session
costs the readings of that table their bound (STATUS_TIMEOUT_SECONDS) and nothing else.
What could be read is shown; what could not is named by what it is ("receipts: locked,
not read within 3 s"), and the verdict is never OK with a part unread.

On PostgreSQL, ``locked_tables`` first takes each of the app's tables' weakest lock
(ACCESS SHARE, what any read takes), within one shared bound: a table held ACCESS
EXCLUSIVE (LOCK TABLE, a migration, VACUUM FULL) is named, and the readings of it are
not tried again, so one lock costs one bound, not one per reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.apps import apps
from django.db import DatabaseError, connection, transaction
from django.db.models import Model

from ..core.faults import BOUND, NotAnswering, bound_fired, bounds_params, database_deadline

T = TypeVar("T")


@dataclass(frozen=True)
class Unread:
    """A part of the status that could not be read: what it is, and why."""

    what: str
    why: str

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

    def tables_probe(self, models: Iterable[type[Model]] | None = None) -> list[str]:
        """Find which of ``models``' tables (by default the app's) are locked, within
        the bound; the readings of them are then not tried (PostgreSQL; nothing
        elsewhere)."""
        try:
            locked = locked_tables(app_tables() if models is None else models, self.seconds)
        except DatabaseError:  # no database at all: each reading names it, on its bound
            return []
        self._locked.update(locked)
        return locked

    def read(self, what: str, models: Iterable[type[Model]], fn: Callable[[], T], default: T) -> T:
        """``fn()`` within the bound, or ``default``, ``what`` then named unread."""
        tables = [m._meta.db_table for m in models]
        if what in self._failed:
            return default
        held = [t for t in tables if t in self._locked]
        if held:
            why = f"locked ({', '.join(held)}), not read within {self.seconds:g} s"
            return self._unread(what, why, default)
        try:
            with database_deadline(self.seconds):
                return fn()
        except DatabaseError as exc:  # NotAnswering too
            return self._unread(what, unread_reason(exc), default)

    def _unread(self, what: str, why: str, default: T) -> T:
        unread = Unread(what, why)
        self._failed[what] = unread
        self.unread.append(unread)
        return default

    def failed(self, what: str) -> bool:
        return what in self._failed


def locked_tables(models: Iterable[type[Model]], seconds: float) -> list[str]:
    """The tables of ``models`` whose ACCESS SHARE lock (what a read takes) is not
    granted within ``seconds`` in all: each is tried in a savepoint of its own, so one
    locked table leaves the rest to be tried, with what is left of the bound. Tables not
    tried before the bound ran out are named too. PostgreSQL only ([] elsewhere: SQLite
    has no table locks, its readings' own errors say when the file is locked)."""
    if connection.vendor != "postgresql":
        return []
    deadline = time.monotonic() + seconds
    locked: list[str] = []
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                locked.append(table)
                continue
            try:
                with transaction.atomic():
                    bounds = bounds_params(lock_timeout_ms=left_ms, statement_timeout_ms=left_ms)
                    cursor.execute(BOUND, bounds)
                    cursor.execute(f"LOCK TABLE {quote(table)} IN ACCESS SHARE MODE")
            except DatabaseError as exc:
                # a table missing or refused is for its readings to name; a lock is here
                if bound_fired(exc):
                    locked.append(table)
    return locked


def unread_reason(exc: BaseException) -> str:
    """Why a reading failed: "locked, not read within 3 s", "database not answering
    within 3 s" (a statement too slow), or the database error's name."""
    if isinstance(exc, NotAnswering):
        if exc.locked:
            return f"locked, not read within {exc.seconds:g} s"
        return str(exc)
    # the driver's own class names the fault (UndefinedTable), Django's only its kind
    return f"database error ({type(exc.__cause__ or exc).__name__})"
