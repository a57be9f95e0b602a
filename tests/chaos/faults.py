"""The faults of a run, in sequence, each recorded as a window: when it began, when it
was over (the process back, the server started, the lock released), and what was done.

- ``relay_kill``: SIGKILL to the relay while the merchant has a request of it in flight
  (within a bounded wait), then a new relay;
- ``gunicorn_kill``: SIGKILL to every gunicorn worker (the master starts new ones);
- ``postgres_stop``: ``pg_ctl stop -m immediate`` (a crash: no shutdown checkpoint,
  every session cut), the server down for a while, then started (crash recovery);
- ``frozen_relay`` (window ``frozen-relay``): SIGSTOP to the relay, held past its
  requests' leases, then SIGCONT: alive to every process check, doing nothing;
- ``broker_outage`` (window ``broker-outage``): Redis stopped, held down, then started on
  its port (nothing persisted: queued tasks and cached windows are gone);
- ``lock_receipts`` / ``lock_outbox``: ``LOCK TABLE … IN ACCESS EXCLUSIVE MODE`` held in
  a connection of its own, then rolled back;
- ``snapshot``: a ``REPEATABLE READ`` transaction that reads, then stays open (it pins
  the xmin horizon), then ends;
- ``noisy_neighbours`` (window ``noisy-neighbours``): six bad merchants added beside the
  run's merchant (two thirds never answer, the rest answer 503), subscribed to its event
  types with the default timeout, held, then disabled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field

import psycopg

from tests.chaos.merchant import EVENTS as MERCHANT_EVENTS
from tests.chaos.neighbours import BadMerchant
from tests.chaos.processes import cpu_ticks

RECEIPTS = "webhook_receiver_webhookreceipt"
OUTBOX = "webhook_receiver_outboxmessage"

NOISY = "noisy-neighbours"  # the window of noisy_neighbours, as the report names it
FROZEN = "frozen-relay"
BROKER = "broker-outage"
# bad destinations beside the run's merchant: were the relay to wait for them, enough to
# hold it for a timeout each
NEIGHBOURS = 6
# seconds to add (or disable) the neighbours, about: a manage.py process each, at once,
# on a machine already busy with the run
NEIGHBOURS_SETUP = 10


@dataclass
class Window:
    name: str
    start: float
    end: float = 0.0
    detail: str = ""
    # the span the fault held in full, when its window is wider (the neighbours'
    # adding and disabling lie outside it)
    hold: tuple[float, float] | None = None


@dataclass
class Holds:
    """How long each fault holds, in seconds."""

    postgres_down: float
    lock: float
    snapshot: float
    neighbours: float  # every noisy neighbour subscribed
    frozen: float  # the relay stopped (SIGSTOP)
    broker_down: float
    gap: float  # quiet time between faults


# the relay stays frozen for a minute in both: what notices it (its pickup, its heartbeat
# at three of its intervals) needs 30 s, and a shorter freeze is not a fault anyone could
# be told of
SHORT = Holds(postgres_down=5, lock=10, snapshot=10, neighbours=15, frozen=60, broker_down=30,
              gap=4)  # fmt: skip
LONG = Holds(postgres_down=10, lock=25, snapshot=40, neighbours=30, frozen=60, broker_down=180,
             gap=15)  # fmt: skip


@dataclass
class Faults:
    stack: object  # run.Stack: the servers and processes
    holds: Holds
    log: Callable[[str], None]
    windows: list[Window] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def sequence(self) -> list[Callable[[], None]]:
        return [
            self.noisy_neighbours,  # first: a skipped one would leave no figure
            self.relay_kill,
            self.gunicorn_kill,
            self.frozen_relay,
            self.postgres_stop,
            self.broker_outage,
            self.lock_receipts,
            self.lock_outbox,
            self.snapshot,
        ]

    def duration(self) -> float:
        """About how long the sequence takes (to spread the sender's events over it)."""
        h = self.holds
        restarts = 3 * 8  # a relay, gunicorn's workers, Redis: seconds each, about
        neighbours = h.neighbours + 2 * NEIGHBOURS_SETUP
        gaps = (len(self.sequence()) + 1) * h.gap
        down = h.postgres_down + h.frozen + h.broker_down
        return down + 2 * h.lock + h.snapshot + neighbours + restarts + gaps

    def run(self, stop: Callable[[], bool]) -> None:
        time.sleep(self.holds.gap)
        for fault in self.sequence():
            if stop() or self.stack.stopping:
                return
            try:
                fault()
            except Exception as exc:  # the run goes on; the report names the fault
                self.errors.append(f"{fault.__name__}: {type(exc).__name__}: {exc}")
                self.log(f"fault {fault.__name__} failed: {exc!r}")
            time.sleep(self.holds.gap)

    def _unless_stopping(self, start: Callable[[], None]) -> None:
        """Start a server again, unless the run is being stopped (an interrupted run must
        not leave a server started after its clean-up)."""
        with self.stack.starting:
            if self.stack.stopping:
                raise RuntimeError("the run is stopping")
            start()

    def _window(self, name: str, detail: str = "") -> Window:
        window = Window(name, time.time(), detail=detail)
        self.windows.append(window)
        self.log(f"fault {name} begins {detail}")
        return window

    def _close(self, window: Window, detail: str = "") -> None:
        window.end = time.time()
        if detail:
            window.detail = (window.detail + " " + detail).strip()
        self.log(f"fault {window.name} over after {window.end - window.start:.1f} s {detail}")

    # --- the faults ---------------------------------------------------------------------

    def relay_kill(self) -> None:
        stack = self.stack
        book = stack.merchant.book
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and book.in_flight == 0:
            time.sleep(0.005)
        mid = book.in_flight > 0
        with stack.process_lock:
            window = self._window("relay_kill", f"(a relay request in flight: {mid})")
            stack.relay.kill()
            self._unless_stopping(stack.relay_restart)
        self._close(window, "(a new relay ready)")

    def gunicorn_kill(self) -> None:
        web = self.stack.web
        pids = web.worker_pids()
        # wait (a bounded while) for a worker that is using the CPU: a request in hand
        busy, deadline = False, time.monotonic() + 10
        before = {pid: cpu_ticks(pid) for pid in pids}
        while not busy and time.monotonic() < deadline:
            time.sleep(0.01)
            now = {pid: cpu_ticks(pid) for pid in pids}
            busy = any(now[pid] > ticks for pid, ticks in before.items())
            before = now
        window = self._window("gunicorn_kill", f"({len(pids)} workers, one busy: {busy})")
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = web.worker_pids()
            if len(now) >= web.workers and not set(now) & set(pids) and web.answers():
                break
            time.sleep(0.05)
        self._close(window, "(new workers serving)")

    def postgres_stop(self) -> None:
        pg = self.stack.postgres
        window = self._window("postgres_stop", f"({self.holds.postgres_down:g} s down)")
        pg.stop("immediate")
        time.sleep(self.holds.postgres_down)
        self._unless_stopping(pg.start)
        self._close(window, "(started, accepting connections)")

    def frozen_relay(self) -> None:
        relay = self.stack.relay
        seconds = self.holds.frozen
        window = self._window(FROZEN, f"({seconds:g} s, SIGSTOP to {relay.name})")
        os.killpg(relay.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:  # whatever happens, never leave it stopped
            with suppress(ProcessLookupError):
                os.killpg(relay.pid, signal.SIGCONT)
        self._close(window, "(SIGCONT)")

    def broker_outage(self) -> None:
        redis = self.stack.redis
        window = self._window(BROKER, f"({self.holds.broker_down:g} s down)")
        redis.stop()
        time.sleep(self.holds.broker_down)
        self._unless_stopping(redis.start)
        self._close(window, "(answering)")

    def _hold(self, name: str, statements: list[str], seconds: float) -> None:
        conn = psycopg.connect(self.stack.postgres_dsn, connect_timeout=5, autocommit=True)
        try:
            started = time.monotonic()
            for statement in statements:
                conn.execute(statement)
            window = self._window(name, f"({seconds:g} s)")
            window.detail += f" (taken in {time.monotonic() - started:.2f} s)"
            time.sleep(seconds)
            conn.execute("ROLLBACK")
            self._close(window, "(released)")
        finally:
            conn.close()

    def lock_receipts(self) -> None:
        self._hold("lock_receipts", _lock(RECEIPTS), self.holds.lock)

    def lock_outbox(self) -> None:
        self._hold("lock_outbox", _lock(OUTBOX), self.holds.lock)

    def snapshot(self) -> None:
        read = [
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            f"SELECT count(*) FROM {RECEIPTS}",  # the snapshot is taken: xmin pinned
        ]
        self._hold("snapshot", read, self.holds.snapshot)

    def noisy_neighbours(self) -> None:
        """Bad merchants beside the run's merchant (``neighbours.py``), added and disabled
        with ``manage.py webhook_destination`` as an operator would. The window runs from
        the first add to the last server stopped; its hold, from the last add to the
        first disable, is the span every neighbour was subscribed."""
        count = NEIGHBOURS
        holes = count * 2 // 3
        neighbours = [BadMerchant(f"neighbour-{n}", fails=n >= holes) for n in range(count)]
        window = self._window(NOISY, f"({count} bad destinations beside the relay's: "
                              f"{holes} never answer, {count - holes} answer 503; the "
                              "default 10 s timeout)")  # fmt: skip
        most = 0  # requests the black holes held at once, at the most (sampled)
        try:
            for neighbour in neighbours:
                neighbour.start()
            self._each(neighbours, self._neighbour_add)
            held = time.time()
            window.detail += f" (added in {held - window.start:.1f} s)"
            while time.time() < held + self.holds.neighbours:
                time.sleep(0.1)
                most = max(most, sum(n.in_flight for n in neighbours))
            window.hold = (held, time.time())
        finally:
            disabling = time.time()
            try:
                self._each(neighbours, self._neighbour_disable)
            finally:
                for neighbour in neighbours:
                    neighbour.stop()
                said = _neighbours_said(neighbours, window, most)
                self._close(window, f"{said} (disabled in {time.time() - disabling:.1f} s)")

    def _neighbour_add(self, neighbour: BadMerchant) -> None:
        self.stack.manage(
            "webhook_destination", "add", neighbour.name, "--url", neighbour.url,
            "--secret", neighbour.secret, "--events", MERCHANT_EVENTS,
        )  # fmt: skip

    def _neighbour_disable(self, neighbour: BadMerchant) -> None:
        self.stack.manage("webhook_destination", "disable", neighbour.name)

    def _each(self, neighbours: list[BadMerchant], act: Callable[[BadMerchant], None]) -> None:
        """``act`` on every neighbour at once (a manage.py process each takes a second);
        the first error is raised once all are done."""
        with ThreadPoolExecutor(len(neighbours)) as pool:
            futures = [pool.submit(act, neighbour) for neighbour in neighbours]
        for future in futures:
            future.result()


def _neighbours_said(neighbours: list[BadMerchant], window: Window, most: int) -> str:
    """What the neighbours took: requests, and how many the black holes held at once."""
    holes = sum(n.requests for n in neighbours if not n.fails)
    failing = sum(n.requests for n in neighbours if n.fails)
    hold = window.hold
    held = f"held {hold[1] - hold[0]:.1f} s with every one subscribed" if hold else "not held"
    return (
        f"({held}; the black holes took {holes} requests and held up to {most} in flight "
        f"at once; the 503s answered {failing})"
    )


def _lock(table: str) -> list[str]:
    # the LOCK itself queues behind open transactions: bounded, so a run never hangs
    lock = f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    return ["BEGIN", "SET LOCAL lock_timeout = '10s'", lock]
