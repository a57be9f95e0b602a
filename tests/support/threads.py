"""Threads started together for a race, then waited for."""

from __future__ import annotations

import threading


def run_together(threads: list[threading.Thread], timeout: float | None = None) -> None:
    """Start them all before waiting for any, then wait for each (``timeout`` seconds at
    most each: a hung one fails the test's assertions rather than hanging the suite)."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
