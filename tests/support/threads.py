"""Threads started together for a race, then waited for; and a loop run in a thread of
its own while a block runs."""

from __future__ import annotations

import threading
from typing import Self


def run_together(threads: list[threading.Thread], timeout: float | None = None) -> None:
    """Start them all before waiting for any, then wait for each (``timeout`` seconds at
    most each: a hung one fails the test's assertions rather than hanging the suite)."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)


class InBackground:
    """A context manager that runs ``_run`` in a daemon thread of its own while its block
    runs: ``_stop`` is set when the block ends, and the thread waited for
    (``join_seconds`` at most)."""

    join_seconds = 30.0

    def __enter__(self) -> Self:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_seconds)

    def _run(self) -> None:
        raise NotImplementedError
