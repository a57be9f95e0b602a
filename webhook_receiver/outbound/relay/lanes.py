"""Lanes: in a worker process, each destination being relayed runs in a thread of its own.

Why: a relay run holds whatever runs it for as long as its destination's answers take,
up to its timeout, round after round until its breaker opens. Run in the Celery task,
that was a worker process: W destinations that never answer held all W processes, and
every other destination's runs queued behind them (a healthy merchant's p99 went from
0.2 s to 40 s beside six bad ones). The ``relay_destination`` task now hands the
destination to its lane and returns at once: a destination that does not answer holds
its own lane's thread, nothing another destination needs.

A lane runs ``relay_run`` (claim, send, record, until nothing is eligible, its limits
stop it, or its budget is spent), then ends. A task for a destination whose lane is
still running marks the lane to run once more when done, so that a message admitted
after its last claim is not left for the sweep. At most ``MAX_LANES`` a process; past
that a task is left to the next sweep, with one line in the log. The threads are
pooled: a lane that ends leaves its thread, and its database connection (kept as
``CONN_MAX_AGE`` says), to the next destination, so a run costs no new connection; a
process holds as many as it relayed destinations at once, at its busiest.

Everything that makes the relay correct lives in the database (the destination row's
lock, leases, the in-flight count): lanes of several processes, or machines, relaying
one destination are as safe as several workers were. A process that dies mid-round
leaves its messages leased; they go again under their keys when the leases end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from ...core.outages import tolerates_database_errors
from .run import relay_run

logger = logging.getLogger(__name__)

# destinations relayed at once by one process (a thread and, while it runs, a database
# connection each); beyond it a destination waits for the next sweep
MAX_LANES = 256
# how long a worker process that is stopping waits for its lanes to record what they sent:
# a round of fast answers is recorded; one waiting on a merchant that does not answer is
# left to its lease, so that a stop is not held past a supervisor's patience (make run
# gives the worker 10 s)
FINISH_SECONDS = 5.0

Start = Callable[[Callable[[], None], str], None]


class _LaneThreads:
    """The process's lane threads, made on first use (after a Celery worker has forked,
    so that no thread crosses a fork) and kept for the next lane."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self, target: Callable[[], None], name: str) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_LANES, thread_name_prefix="relay-lane")
        self._pool.submit(target)


class RelayLanes:
    """The destinations one process is relaying, a thread each. ``start`` runs a lane on
    a thread and ``run`` is what a lane runs (the evaluation harness gives its own: a
    thread in simulated time, and the run with its simulated network and clock)."""

    def __init__(
        self,
        start: Start | None = None,
        limit: int = MAX_LANES,
        run: Callable[[int], object] = relay_run,
    ) -> None:
        self._start = start or _LaneThreads()
        self.run = run  # what a lane runs: a relay run of one destination
        self._limit = limit
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # destination id -> asked to run once more (a task came while it ran)
        self._running: dict[int, bool] = {}
        self._full_since: float | None = None

    def relay(self, destination_id: int) -> bool:
        """Relay the destination in its lane: start one, or mark the running one to go
        once more. Returns whether a lane started."""
        with self._lock:
            if destination_id in self._running:
                self._running[destination_id] = True
                return False
            if len(self._running) >= self._limit:
                self._say_full(destination_id)
                return False
            self._full_since = None
            self._running[destination_id] = False
        try:
            self._start(lambda: self._lane(destination_id), f"relay-lane-{destination_id}")
        except BaseException:
            # no lane started (a soft time limit that fired in the task, no thread to
            # be had): the destination is not left marked as running in this process
            with self._lock:
                self._running.pop(destination_id, None)
                self._idle.notify_all()
            raise
        return True

    def running(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def finish(self, timeout: float = FINISH_SECONDS) -> bool:
        """Wait until no lane runs (a worker process stopping), at most ``timeout``
        seconds. Returns whether they all ended."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout)

    def _lane(self, destination_id: int) -> None:
        # a database error: one line, and the sweep tries again
        run = tolerates_database_errors(self.run)
        while True:
            # as a Celery task's start and end do: a connection that broke, or outlived
            # CONN_MAX_AGE, is closed, and the run opens a fresh one
            close_old_connections()
            try:
                run(destination_id)
            except Exception:
                logger.exception("outbox: the lane of destination %s failed", destination_id)
            finally:
                close_old_connections()
            with self._lock:
                if not self._running.get(destination_id):
                    self._running.pop(destination_id, None)
                    self._idle.notify_all()
                    return
                self._running[destination_id] = False

    def _say_full(self, destination_id: int) -> None:
        # one line per stretch of being full, not one per task
        if self._full_since is None:
            self._full_since = time.monotonic()
            logger.warning(
                "outbox: %d destinations are being relayed by this process, its most; "
                "destination %s waits for the next sweep",
                self._limit,
                destination_id,
            )


# this process's lanes (a Celery worker's pool process has its own)
lanes = RelayLanes()
