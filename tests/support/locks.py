"""A table held locked by another session, for the tests of a database that does not answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def table_locked(session: psycopg.Connection, table: str, *, for_seconds: float) -> Iterator[None]:
    """``table`` locked ACCESS EXCLUSIVE by ``session`` (a migration, VACUUM FULL, a REINDEX
    without CONCURRENTLY), released after ``for_seconds`` at the latest: a statement
    that waits for it unbounded is answered late instead of hanging the suite."""
    session.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(for_seconds, session.rollback)
    release.start()
    try:
        yield
    finally:
        release.cancel()
        session.rollback()
