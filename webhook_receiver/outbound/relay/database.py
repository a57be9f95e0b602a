"""How the relay's event loop reaches the database: Django's database API is synchronous,
so the loop hands each piece of database work (a round, the poll, a heartbeat) to a
thread that holds a connection, and awaits it.

``DatabaseThreads`` is a relay process's: a fixed number of threads, each with its own
connection (``RELAY_DATABASE_CONNECTIONS``, 2 by default), whatever the number of
destinations. ``CallerDatabase`` does the work on the thread that owns the connection
(a test's, with its transaction; the evaluation's, with its simulated clock), one call
at a time, the loop held meanwhile: nothing moves while the database works, so a run
is the same each time.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

from django.db import connection

T = TypeVar("T")


def interruption(exc: BaseException) -> BaseException | None:
    """The Ctrl-C or the exit (SIGTERM turned into SystemExit) that ``exc`` is, or that
    it was raised while handling."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt | SystemExit):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


class Database(Protocol):
    async def call(self, fn: Callable[[], T], what: str = "") -> T:
        """``fn()`` on a thread with a database connection; ``what`` names the work
        ("round", "poll", "heartbeat"), for a harness that counts it."""

    def close(self) -> None:
        """Its connections closed (no call after)."""


class DatabaseThreads:
    """``connections`` threads, each with a Django connection of its own, taking calls in
    turn. A connection that broke is replaced before a call; one that works is kept
    whatever CONN_MAX_AGE says: Django's default, 0, closes a connection at the end of
    each request, which here would be a new connection for every round (and, while the
    old one's backend exits, one more connection than the process is allowed)."""

    def __init__(self, connections: int, name: str = "relay-db") -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{n}", daemon=True)
            for n in range(connections)
        ]
        for thread in self._threads:
            thread.start()

    async def call(self, fn: Callable[[], T], what: str = "") -> T:
        done: Future[T] = Future()
        self._calls.put((fn, done))
        return await asyncio.wrap_future(done)

    def _serve(self) -> None:
        try:
            while (item := self._calls.get()) is not None:
                fn, done = item
                if not done.set_running_or_notify_cancel():
                    continue
                connection.close_at = None  # no age limit: see the class's docstring
                connection.close_if_unusable_or_obsolete()
                try:
                    done.set_result(fn())
                except BaseException as exc:
                    done.set_exception(exc)
        finally:
            connection.close()

    def close(self) -> None:
        for _ in self._threads:
            self._calls.put(None)
        for thread in self._threads:
            thread.join(timeout=10)


class CallerDatabase:
    """Database work done by the thread that made this (``serve`` runs it there) while
    an event loop runs on another; a call holds its loop until the work is done."""

    _DONE = object()

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._interrupted: BaseException | None = None

    async def call(self, fn: Callable[[], T], what: str = "") -> T:
        if self._interrupted is not None:
            raise RuntimeError("the database's thread was interrupted") from self._interrupted
        done: Future[T] = Future()
        self._calls.put((self.wrapped(fn, what), done))
        # the loop waits: nothing else moves meanwhile. Looked at again every 0.2 s: a
        # call put after an interruption drained the queue is never run
        while True:
            try:
                return done.result(timeout=0.2)
            except FutureTimeout:
                if self._interrupted is not None:
                    raise RuntimeError("the database's thread was interrupted") from None

    def wrapped(self, fn: Callable[[], T], what: str) -> Callable[[], T]:
        """What the owner's thread runs for a call (a harness adds its bookkeeping)."""
        return fn

    def serve(
        self, loop_thread: Callable[[], object], stop: Callable[[], object] | None = None
    ) -> None:
        """Run ``loop_thread`` (which runs an event loop) on a thread of its own, and the
        database work it asks for here, until it returns; its exception is raised here.
        An interruption here (Ctrl-C, SIGTERM turned into an exception) fails the call
        in hand, calls ``stop`` (which stops the loop) and is raised once the loop's
        thread has ended."""
        failure: list[BaseException] = []

        def run() -> None:
            try:
                loop_thread()
            except BaseException as exc:
                failure.append(exc)
            finally:
                self._calls.put(self._DONE)

        thread = threading.Thread(target=run, name="relay-loop", daemon=True)
        thread.start()
        done: Future[Any] | None = None
        try:
            while (item := self._next()) is not self._DONE:
                fn, done = item
                try:
                    done.set_result(fn())
                except Exception as exc:
                    if (cause := interruption(exc)) is not None:
                        # psycopg cancelled the statement on Ctrl-C and failed on the
                        # way: the run is interrupted, not the call alone
                        raise cause from None
                    done.set_exception(exc)
                done = None
        except BaseException as exc:
            self._interrupted = exc
            if done is not None and not done.done():
                done.set_exception(RuntimeError("interrupted"))
            if stop is not None:
                stop()
            self._drain()
            thread.join(timeout=30)
            raise
        thread.join()
        if failure:
            raise failure[0]

    def _next(self) -> Any:
        # a wait that a signal can interrupt (a plain get() is not, on every platform)
        while True:
            try:
                return self._calls.get(timeout=0.2)
            except queue.Empty:
                continue

    def _drain(self) -> None:
        """Fail every call still waiting (the loop's thread is being stopped)."""
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return
            if item is not self._DONE:
                item[1].set_exception(RuntimeError("interrupted"))

    def close(self) -> None:
        pass
