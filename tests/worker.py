"""A real Celery worker on the real Redis broker, for the tests where Celery matters.

The worker is a subprocess on the test database (PostgreSQL only: SQLite's test database
is in memory), in a process group of its own so that SIGKILL reaches its pool child.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def broker():
    """The real Redis on this machine, on a database of the tests' own."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()


def start_worker(log: Path, marker_dir: Path | None = None) -> subprocess.Popen:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    if marker_dir is not None:
        env["WEBHOOK_TEST_MARKER_DIR"] = str(marker_dir)
    command = [sys.executable, "-m", "celery", "-A", "project", "worker"]
    command += ["--pool", "prefork", "--concurrency", "1", "--loglevel", "INFO"]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL reaches the pool child too
    )


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
