"""Recovery jobs on real relay processes (``manage.py webhook_relay``), a real PostgreSQL
and a real merchant over HTTP (a thread of this process).

- A relay SIGKILLed halfway through a job: the next relay goes on from the job's last
  commit. The run releases exactly what the plan counted, every key arrives, a key
  arrives twice only if it was ``sending`` at the kill (the at-least-once of a lease,
  never a second release by the job), and each ordering key's first arrivals keep id
  order.
- A job beside live traffic on the same destination: every live message admitted
  during the run is delivered, none waiting more than a bound the pace implies.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.support.outbox import relay_merchant
from tests.support.worker import wait_for
from webhook_receiver.models import MessageStatus, OutboxMessage, RecoveryJob
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.recovery import Criteria, recovery_start
from webhook_receiver.outbound.recovery_run import RELEASED_AHEAD_SECONDS
from webhook_receiver.outbound.tenancy import EVERY_TENANT

pytestmark = [
    pytest.mark.postgres_only("real relay processes on the test database"),
    pytest.mark.django_db(transaction=True),
]

# the relays' poll, which finds a message whose lease ran out (as test_crashes.py)
POLL = {"WEBHOOK_RELAY_POLL_SECONDS": "0.3"}
FAILED, SENDING, DELIVERED = MessageStatus.FAILED, MessageStatus.SENDING, MessageStatus.DELIVERED


@pytest.fixture(autouse=True)
def _catalog_off(settings) -> None:
    # the live messages' type need not be declared in the catalog
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": "off"}


# --- the merchant --------------------------------------------------------------------


@dataclass
class Merchant:
    """What reached the merchant: (CLOCK_MONOTONIC time, ``webhook-id``) per request."""

    url: str = ""
    arrivals: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(key for _, key in self.arrivals)

    def first_arrivals(self) -> dict[str, float]:
        with self.lock:
            first: dict[str, float] = {}
            for at, key in self.arrivals:
                first.setdefault(key, at)
            return first


@contextmanager
def merchant_serving(answer_after: float = 0.0) -> Iterator[Merchant]:
    """A merchant on a loopback port (HTTP/1.1, keep-alive, a thread a connection) that
    records each request as it is read and answers 200 ``answer_after`` seconds later."""
    merchant = Merchant()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with merchant.lock:
                merchant.arrivals.append((time.monotonic(), self.headers.get("webhook-id", "")))
            time.sleep(answer_after)
            body = b'{"ok": true}'
            try:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:
                self.close_connection = True  # a killed relay's: nobody to answer

        def log_message(self, *args: object) -> None:
            pass  # a line a request would drown the test's output

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    merchant.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield merchant
    finally:
        server.shutdown()
        server.server_close()


# --- helpers -------------------------------------------------------------------------


def failed_messages(dest, count: int, orders: int) -> list[OutboxMessage]:
    """``count`` failed messages (a merchant that was down), admitted ten minutes ago,
    their ordering keys taken in turn from ``orders`` orders."""
    at = timezone.now() - timedelta(minutes=10)
    return OutboxMessage.objects.bulk_create(
        OutboxMessage(
            destination=dest,
            key=f"r{n:04d}",
            event_type="order.paid",
            payload={"type": "order.paid", "data": {"n": n}},
            ordering_key=f"order:{n % orders}",
            status=FAILED,
            attempts=5,
            failures=5,
            last_status_code=503,
            next_attempt_at=at,
            created_at=at,
        )
        for n in range(count)
    )


def start_recovery(dest, rate: float) -> RecoveryJob:
    since = timezone.now() - timedelta(hours=1)
    return recovery_start(
        scope=EVERY_TENANT,
        destination=dest,
        criteria=Criteria(kind="recover", since=since),
        by="ops",
        rate=rate,
    )


def job_now(job: RecoveryJob) -> RecoveryJob:
    job.refresh_from_db()
    return job


def other_backends() -> int:
    """Connections to the test database besides this one: a killed relay's go once
    PostgreSQL sees them closed (a statement it was running has ended by then)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


# --- a relay killed halfway ----------------------------------------------------------

PLANNED, ORDERS = 600, 30
JOB_RATE = 200.0
# the kill comes once this many are released: a step releases at most 2 s of the job's
# rate (400: its credit's cap), so from below a third it cannot reach the end, and the
# kill always falls partway, at about a third to two thirds
KILL_AT = PLANNED // 3


def test_a_relay_killed_halfway_through_a_job_leaves_the_next_to_finish_it_once(relays):
    # given: 600 failed messages of 30 orders, a merchant that answers after 50 ms (so
    # that some requests are in flight at any moment), and a relay
    with merchant_serving(answer_after=0.05) as merchant:
        dest = relay_merchant(merchant.url, rate_count=400, burst=50, max_in_flight=20)
        rows = failed_messages(dest, PLANNED, ORDERS)
        (first,) = relays(1, **POLL)

        # when: a job recovers them at 200/s, and once about half is released with
        # requests in flight, the relay is SIGKILLed
        job = start_recovery(dest, JOB_RATE)
        seen: list[tuple[float, int, int]] = []

        def partway() -> bool:
            released = job_now(job).released
            sending = OutboxMessage.objects.filter(status=SENDING).count()
            seen.append((round(time.monotonic(), 2), released, sending))
            return KILL_AT <= released < PLANNED and sending > 0

        try:
            wait_for(partway, 20, "partway released, requests in flight")
        except AssertionError:
            raise AssertionError(f"{seen} {first.tail()}") from None
        first.kill()
        wait_for(lambda: other_backends() == 0, 10, "the killed relay's connections to end")
        released_at_kill = job_now(job).released
        sending_at_kill = set(
            OutboxMessage.objects.filter(status=SENDING).values_list("key", flat=True)
        )
        # their leases run out after the timeout + 24 s: moved to the past rather than
        # waited for (as test_crashes.py does); the new relay's poll takes them over
        OutboxMessage.objects.filter(status=SENDING).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )
        (second,) = relays(1, **POLL)
        wait_for(
            lambda: (
                job_now(job).state == "done"
                and OutboxMessage.objects.filter(status=DELIVERED).count() == PLANNED
            ),
            30,
            f"the job done and every message delivered ({second.tail()})",
        )

    # then: the killed relay stopped a job it had partly released, with requests in flight
    assert KILL_AT <= released_at_kill < PLANNED
    assert sending_at_kill
    # the run released what the plan counted, once each (released counts rows it changed)
    assert job.released == job.planned == PLANNED
    assert set(OutboxMessage.objects.values_list("recovery_id", flat=True)) == {job.pk}
    # every key arrived; one that arrived twice was in flight at the kill: its lease's
    # at-least-once, not a second release by the job
    counts = merchant.counts()
    assert set(counts) == {m.key for m in rows}
    twice = {key for key, n in counts.items() if n > 1}
    assert twice <= sending_at_kill, twice - sending_at_kill
    # each order's messages first arrived one after another in id order
    first_at = merchant.first_arrivals()
    by_order: dict[str, list[OutboxMessage]] = defaultdict(list)
    for m in sorted(rows, key=lambda m: m.id):
        by_order[m.ordering_key].append(m)
    for order, messages in by_order.items():
        keys_by_id = [m.key for m in messages]
        assert sorted(keys_by_id, key=first_at.__getitem__) == keys_by_id, order


# --- live traffic beside a job -------------------------------------------------------

DEST_RATE, LIVE_RATE, LIVE_JOB_RATE = 100, 10, 50.0
# A live message has the highest id, and a claim takes the oldest eligible first, so it
# goes after every recovered message released before it and while it waits: at most
# ahead = RELEASED_AHEAD_SECONDS x the job's rate (100) wait, the job adds its rate,
# the live messages theirs, and the destination sends DEST_RATE a second (the merchant
# answers at once, and at this size the relay keeps up). The queue ahead of it drains at
# 100 - 50 - 10 = 40/s at least: 100 / 40 = 2.5 s; and 1 s for its wake-up (a
# notification, else the 0.3 s poll) and a busy two-core machine.
LIVE_WAIT_BOUND = (
    RELEASED_AHEAD_SECONDS * LIVE_JOB_RATE / (DEST_RATE - LIVE_JOB_RATE - LIVE_RATE) + 1.0
)


def test_live_messages_beside_a_job_are_delivered_within_the_bound_its_pace_leaves(relays):
    # given: 300 failed messages of 10 orders, a merchant that answers at once, a relay
    with merchant_serving() as merchant:
        dest = relay_merchant(merchant.url, rate_count=DEST_RATE, burst=20, max_in_flight=10)
        failed_messages(dest, 300, 10)
        (relay,) = relays(1, **POLL)

        # when: a job recovers them at 50/s (6 s) while live messages are admitted, 10 a
        # second, each committed on its own with an order of its own
        job = start_recovery(dest, LIVE_JOB_RATE)
        committed: dict[str, float] = {}
        while job_now(job).state == "running":
            key = f"live-{len(committed)}"
            with transaction.atomic():
                enqueue_webhook(
                    dest, "order.paid", key, {"type": "order.paid", "data": {"key": key}},
                    ordering_key=f"live:{key}",
                )  # fmt: skip
            committed[key] = time.monotonic()
            time.sleep(1 / LIVE_RATE)
        wait_for(lambda: set(committed) <= set(merchant.counts()), 30, f"live ({relay.tail()})")

    # then: the job ran while they were admitted, and each arrived within the bound
    assert job.released == job.planned == 300
    assert len(committed) >= 40  # 6 s of them
    first_at = merchant.first_arrivals()
    waits = sorted(first_at[key] - at for key, at in committed.items())
    assert waits[-1] <= LIVE_WAIT_BOUND, (waits[len(waits) // 2], waits[-1], LIVE_WAIT_BOUND)
