"""Real processes on the test database: a Celery worker on the real Redis broker, for the
tests where Celery matters, and relay processes (``manage.py webhook_relay``).

Each is a subprocess on the test database (PostgreSQL only: SQLite's test database is
in memory), in a process group of its own so that SIGKILL reaches a worker's pool child.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.support.paths import REPO

if TYPE_CHECKING:
    from webhook_receiver.outbound.relay.engine import Relay


@pytest.fixture
def broker():
    """The real Redis on this machine, on a database of the tests' own."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()


def celery_env() -> dict[str, str]:
    """The environment of a Celery process on the test database and the tests' settings."""
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }


def start_worker(
    log: Path, marker_dir: Path | None = None, *, concurrency: int = 1
) -> subprocess.Popen:
    env = celery_env()
    if marker_dir is not None:
        env["WEBHOOK_TEST_MARKER_DIR"] = str(marker_dir)
    command = [sys.executable, "-m", "celery", "-A", "project", "worker"]
    command += ["--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "INFO"]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL reaches the pool child too
    )


def start_relay(log: Path, *args: str, **settings: str) -> subprocess.Popen:
    """``manage.py webhook_relay`` on the test database, with ``args``; ``settings``:
    environment variables beside it (WEBHOOK_RELAY_POLL_SECONDS="0.2", …)."""
    env = {**celery_env(), "WEBHOOK_TEST_PROCESS_LOGS": "1", **settings}
    return subprocess.Popen(
        [sys.executable, "manage.py", "webhook_relay", *args],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Worker:
    process: subprocess.Popen
    log: Path

    def kill(self) -> None:
        """SIGKILL to its whole process group: the pool child dies with it."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def workers(broker, tmp_path, monkeypatch) -> Iterator[Callable[[int], list[Worker]]]:
    """Start real Celery workers (concurrency 1 each, each its own process group), named
    apart, and wait until they are ready; all are killed at the end."""
    started: list[Worker] = []

    def start(count: int = 1) -> list[Worker]:
        new = []
        for _ in range(count):
            n = len(started) + 1
            log = tmp_path / f"worker{n}.log"
            # celery reads its options from CELERY_<COMMAND>_<OPTION>: a node name each
            monkeypatch.setenv("CELERY_WORKER_HOSTNAME", f"relay{n}@%h")
            worker = Worker(start_worker(log), log)
            started.append(worker)
            new.append(worker)
        for worker in new:
            wait_for(lambda w=worker: " ready." in w.log.read_text(), 60, "a worker to start")
        return new

    yield start
    for worker in started:
        worker.kill()


@dataclass
class RelayProcess:
    process: subprocess.Popen
    log: Path

    def kill(self, signum: int = signal.SIGKILL) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        if signum in (signal.SIGKILL, signal.SIGTERM):
            self.process.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def relays(tmp_path) -> Iterator[Callable[..., list[RelayProcess]]]:
    """Start real relay processes (``manage.py webhook_relay``, each its own process
    group) and wait until each has started; all are killed at the end. Keyword
    arguments are environment variables for them."""
    started: list[RelayProcess] = []

    def start(count: int = 1, **settings: str) -> list[RelayProcess]:
        new = []
        for _ in range(count):
            log = tmp_path / f"relay{len(started) + 1}.log"
            relay = RelayProcess(start_relay(log, **settings), log)
            started.append(relay)
            new.append(relay)
        for relay in new:
            wait_for(lambda r=relay: "relay started" in r.log.read_text(), 60, "a relay to start")
        return new

    yield start
    for relay in started:
        relay.kill()


def relay_running(seconds: float, **options: object) -> Relay:
    """A relay in this process, on database threads of its own (a test with
    ``transaction=True``), for ``seconds``; then stopped as SIGTERM stops one. Returns
    it, to read what it counted."""
    from webhook_receiver.outbound.relay.database import DatabaseThreads
    from webhook_receiver.outbound.relay.engine import Relay

    database = DatabaseThreads(1)
    relay = Relay(database=database, **options)  # type: ignore[arg-type]

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await relay.run(stop)

    try:
        asyncio.run(run())
    finally:
        database.close()
    return relay


@dataclass
class Background:
    """A relay running in a thread of this process (``relay_in_background``)."""

    relay: Relay
    loop: asyncio.AbstractEventLoop

    def in_its_threads(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the relay's loop thread and in its database thread (a profiler
        set there, say), and wait until both have."""

        async def both() -> None:
            fn()
            await self.relay._database.call(fn)

        asyncio.run_coroutine_threadsafe(both(), self.loop).result(10)


@contextmanager
def relay_in_background(**options: object) -> Iterator[Background]:
    """A relay in a thread of this process, on a database thread of its own (a test with
    ``transaction=True``), until the block ends; then stopped as SIGTERM stops one."""
    from webhook_receiver.outbound.relay.database import DatabaseThreads
    from webhook_receiver.outbound.relay.engine import Relay

    database = DatabaseThreads(1)
    relay = Relay(database=database, **options)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    runner = threading.Thread(target=loop.run_until_complete, args=(relay.run(stop),))
    runner.start()
    try:
        yield Background(relay, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        runner.join(30)
        loop.close()
        database.close()
