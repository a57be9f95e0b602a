"""A relay process (``manage.py webhook_relay``), and one destination relayed on the
caller's connection (for tests and tools).

A relay process is the engine (engine.py) on one event loop, with its database threads
(``RELAY_DATABASE_CONNECTIONS``), its listener on PostgreSQL (``RELAY_LISTEN``), its
poll and its heartbeat. SIGTERM or SIGINT stops it: it claims nothing more, waits up to
5 s for its requests in flight, records their answers, and ends; what it could not
record is left to the leases. Run one per machine (or more: every limit lives in the
database, so relays on several machines share each destination's limits exactly).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connection

from ...conf import app_settings
from ...core import logs
from .database import CallerDatabase, DatabaseThreads
from .engine import Relay, Summary
from .session import PeerTransport
from .transport import Transport
from .wakeups import listen, listen_params

logger = logging.getLogger(__name__)

# the threads that resolve destinations' names (getaddrinfo blocks): the loop's
# executor, a fixed few whatever the number of destinations
RESOLVER_THREADS = 4
# open files a relay process needs beside its requests' sockets (its database
# connections, the listener, logs, the resolver)
OTHER_FILES = 64
# allocations between two collections of the youngest generation, in a relay process
# (Python's default is 700): see collector_tuned
YOUNG_COLLECTION_ALLOCATIONS = 10_000


def process_name() -> str:
    """This relay process, as its heartbeat names it."""
    return f"relay {socket.gethostname()} {os.getpid()}"


def relay_serve(
    *,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_seconds: float = 10.0,
    farewell: Callable[[], object] | None = None,
) -> None:
    """Run this process's relay until SIGTERM or SIGINT. ``heartbeat`` is called on a
    database thread every ``heartbeat_seconds`` (the status reads it), ``farewell``
    once the relay has stopped."""
    settings = app_settings()
    max_requests = _open_files_for(settings.relay_max_requests)
    listening = connection.vendor == "postgresql" and settings.relay_listen
    params = listen_params() if listening else {}
    database = DatabaseThreads(settings.relay_database_connections)
    relay = Relay(
        database=database,
        connections=settings.relay_database_connections,
        max_requests=max_requests,
        poll_seconds=settings.relay_poll_seconds,
        heartbeat=heartbeat,
        heartbeat_seconds=heartbeat_seconds,
        recoveries=True,
    )
    logger.info(
        "outbox: relay started: %d database connection(s)%s, a poll every %g s, at most %d "
        "requests in flight",
        settings.relay_database_connections,
        " and one listening for admissions" if listening else "",
        settings.relay_poll_seconds,
        max_requests,
    )
    collector_tuned()
    try:
        asyncio.run(_serve(relay, params if listening else None))
    finally:
        database.close()
    if farewell is not None:
        try:
            farewell()
        except DatabaseError as exc:
            # its heartbeat goes stale instead, as a killed relay's does
            logger.warning("outbox: the relay's heartbeat not removed: %s", logs.error_line(exc))
    logger.info("outbox: relay stopped; %d answers recorded", relay.answered)


def collector_tuned() -> None:
    """The garbage collector set for a relay process. Each request in flight holds its
    objects until its merchant answers, so Python's default (a collection of the youngest
    generation every 700 allocations) finds a thousand requests' objects alive, moves
    them to older generations, and ends in a full collection of the heap every second or
    so: 40% of the process's CPU at 1,000 merchants (docs/benchmarks.md). What start-up
    made (modules, settings, the app registry) is frozen, never collected, and the
    youngest generation is collected less often; cycles still go, a little later."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, middle, oldest)


async def _serve(relay: Relay, listen_to: dict[str, object] | None) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(
        ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="relay-resolve")
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listener = None
    if listen_to is not None:
        listener = asyncio.ensure_future(listen(listen_to, relay.wake, stop))
    try:
        await relay.run(stop)
    finally:
        stop.set()
        if listener is not None:
            await asyncio.gather(listener, return_exceptions=True)


def _open_files_for(requests: int) -> int:
    """Raise this process's open-files limit to what ``requests`` sockets need, as far as
    its hard limit allows; the requests it can hold (fewer than asked, with a line, when
    the hard limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = requests + OTHER_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < wanted:
        fewer = max(1, soft - OTHER_FILES)
        logger.warning(
            "outbox: RELAY_MAX_REQUESTS is %d, and this process may open %d files: at most "
            "%d requests in flight (raise the limit: LimitNOFILE in systemd, ulimit -n)",
            requests,
            soft,
            fewer,
        )
        return fewer
    return requests


def relay_destination(
    *,
    destination_id: int,
    budget_seconds: float = 20.0,
    transport: Callable[[], Transport] = PeerTransport,
) -> tuple[int, float | None]:
    """Relay one destination until it has nothing more now (nothing eligible, its limits
    or breaker stop it, another relay holds it) or ``budget_seconds`` have passed, its
    database work done on this thread's connection (a test's transaction sees it).
    Returns (answers recorded, seconds until its bucket allows the next claim, or None;
    0.0 when the budget ended it)."""
    database = CallerDatabase()
    relay = Relay(database=database, transport=transport)
    result: list[Summary] = []

    def run() -> None:
        result.append(asyncio.run(relay.drain(destination_id, budget_seconds)))

    database.serve(run)
    return result[0].answered, result[0].wait
