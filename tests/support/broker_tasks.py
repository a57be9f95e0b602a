"""The demo's Celery app with one task more, for a worker that must be inside a task when
its broker goes away (tests/test_broker_outage.py): ``celery -A tests.support.broker_tasks``."""

from __future__ import annotations

import time
from pathlib import Path

from project.celery import app

__all__ = ["app", "sleeps"]


@app.task(name="tests.sleeps")
def sleeps(seconds: float, started: str, done: str) -> None:
    """Writes ``started``, sleeps, then writes ``done``."""
    Path(started).write_text("started")
    time.sleep(seconds)
    Path(done).write_text("done")
