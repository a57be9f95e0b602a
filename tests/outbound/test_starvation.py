"""Nothing else starves while the relay is busy, on real processes: a relay process
(``manage.py webhook_relay``) sending to 300 merchants, 30 of which accept the
connection and never answer, beside a Celery worker (prefork, two processes) and beat
on the same PostgreSQL. The relay holds its configured database connections and a
thread count of its own whatever the number of merchants, every healthy message arrives
once, and meanwhile an inbound retry, beat's heartbeat, a silence check and
``webhook_status`` get their connections and run on time.

When a destination's run held a thread and a database connection of the worker, 300
merchants took all of PostgreSQL's 100 connections, and the retries, the heartbeat and
the silence check failed with "too many clients" (docs/sending.md, "The relay: one
process, one loop")."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.support.outbox import destination
from tests.support.paths import REPO
from tests.support.signing import reserved
from tests.support.status import receipt, silence
from tests.support.worker import celery_env, start_worker, wait_for
from webhook_receiver.exceptions import TransientError
from webhook_receiver.inbound.failures import CapturedEvent, failure_capture
from webhook_receiver.models import FailedEvent, FailureStatus, SilenceAlert
from webhook_receiver.outbound.admission import enqueue_webhook
from webhook_receiver.watch.heartbeat import heartbeat_seen_at

pytestmark = [
    pytest.mark.postgres_only("real processes on the test database"),
    pytest.mark.django_db(transaction=True),
]

HEALTHY, HOLES = 270, 30
# messages to each destination, admitted in waves while the relay works
WAVES, PER_WAVE, WAVE_SECONDS = 3, 10, 6.0
# beat's interval tasks (the retry sweep, the heartbeat, the silence check) this often
BEAT_SECONDS = 2.0
# how late a task of beat's may run under this load and still be on time: its interval,
# and this much for a machine of two cores shared by everything here
LATE_SECONDS = 10.0
RELAY_APP = "webhook-relay-starvation"
# the relay's connections: RELAY_DATABASE_CONNECTIONS (2), and the listener
RELAY_CONNECTIONS = 3
# the relay's threads: the loop's, one per database connection, the resolver's (4 at
# most) and the interpreter's own few; none per merchant
RELAY_THREADS = 12


@dataclass
class Samples:
    relay_connections: list[int] = field(default_factory=list)
    all_connections: list[int] = field(default_factory=list)
    relay_threads: list[int] = field(default_factory=list)
    # the relay's threads by name, when they were most
    relay_thread_names: list[str] = field(default_factory=list)
    heartbeats: set[datetime] = field(default_factory=set)
    silence_checks: set[datetime] = field(default_factory=set)


@contextmanager
def merchants(log: Path) -> Iterator[dict]:
    """The merchants (tests/bench/relay_merchants.py): a process listening on a port
    each, answering 200 after 0.2 s, and the black holes; yields their ports and the
    control port."""
    command = [sys.executable, "-m", "tests.bench.relay_merchants"]
    command += ["--merchants", str(HEALTHY), "--black-holes", str(HOLES)]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=log.open("ab"), text=True
    )
    try:
        assert process.stdout is not None
        yield json.loads(process.stdout.readline())
    finally:
        process.terminate()
        process.wait(timeout=10)


def arrivals(control: int) -> list[tuple[float, int, str]]:
    client = http.client.HTTPConnection("127.0.0.1", control, timeout=10)
    try:
        client.request("GET", "/arrivals")
        return json.loads(client.getresponse().read())["arrivals"]
    finally:
        client.close()


def start_beat(log: Path, schedule: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "celery", "-A", "project", "beat", "--loglevel", "INFO"]
    command += ["--schedule", str(schedule)]
    return subprocess.Popen(
        command, cwd=REPO, env=celery_env(), stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def threads_of(pid: int) -> list[str]:
    """The names of a process's threads."""
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return names


def sampling(relay_pid: int, samples: Samples, stop: threading.Event) -> None:
    """Every quarter second until ``stop``: the relay's connections and threads, every
    connection to the test database, and what beat's tasks last wrote."""
    try:
        while not stop.is_set():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FILTER (WHERE application_name = %s), count(*) "
                    "FROM pg_stat_activity WHERE datname = current_database()",
                    [RELAY_APP],
                )
                relay, everyone = cursor.fetchone()
            samples.relay_connections.append(relay)
            samples.all_connections.append(everyone)
            names = threads_of(relay_pid)
            if len(names) > max(samples.relay_threads, default=0):
                samples.relay_thread_names = names
            samples.relay_threads.append(len(names))
            if (seen := heartbeat_seen_at()) is not None:
                samples.heartbeats.add(seen)
            checked = SilenceAlert.objects.values_list("last_checked_at", flat=True).first()
            if checked is not None:
                samples.silence_checks.add(checked)
            stop.wait(0.25)
    finally:
        connection.close()


def largest_gap(times: set[datetime], start: datetime, end: datetime) -> float:
    """The longest stretch between ``start`` and ``end`` with none of ``times``."""
    points = [start, *sorted(t for t in times if start < t < end), end]
    return max((b - a).total_seconds() for a, b in zip(points, points[1:], strict=False))


def admit_wave(destinations: list, wave: int) -> None:
    """PER_WAVE messages to every destination, fifty destinations a transaction."""
    for first in range(0, len(destinations), 50):
        with transaction.atomic():
            for dest in destinations[first : first + 50]:
                for n in range(PER_WAVE):
                    key = f"order:{dest.name}_{wave}_{n}:paid:v1"
                    enqueue_webhook(dest, "order.paid", key, {"type": "order.paid", "n": n})


def capture_due_retry(key: str) -> None:
    """An inventory event whose handler failed on a transient error, due for a retry
    now: the worker's next retry sweep applies it."""
    failure_capture(
        captured=CapturedEvent(
            source="shop",
            event_key=key,
            event_type="inventory.reserved",
            message_id=key,
            signature_timestamp=int(time.time()),
            body=reserved(f"ord_{key}", ("SKU-1", 1)),
            headers={},
        ),
        exc=TransientError("the stock service timed out"),
    )
    FailedEvent.objects.filter(event_key=key).update(next_attempt_at=timezone.now())


def status_timed() -> tuple[float, dict]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "manage.py", "webhook_status", "--json"],
        cwd=REPO,
        env=celery_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return time.monotonic() - started, json.loads(done.stdout)


def test_a_relay_busy_with_300_merchants_starves_nothing_else(
    broker, relays, tmp_path, monkeypatch
):
    # given: beat's tasks every two seconds, a source watched for silence (an alert open
    # since an hour ago: each check refreshes it), 270 healthy merchants and 30 black holes
    monkeypatch.setenv("WEBHOOK_TEST_BEAT_SECONDS", str(BEAT_SECONDS))
    monkeypatch.setenv("WEBHOOK_TEST_SMALL_SILENCE_SECONDS", "600")
    now = timezone.now()
    receipt("small", now - timedelta(hours=2))
    silence("small", opened=now - timedelta(hours=1), last=now - timedelta(hours=2))
    with merchants(tmp_path / "merchants.log") as fleet:
        urls = [f"http://127.0.0.1:{port}/hook" for port in fleet["ports"] + fleet["holes"]]
        destinations = [destination(f"m{n:03}", url) for n, url in enumerate(urls)]

        # and: a worker of two processes, beat and a relay, all on the test database
        worker = start_worker(tmp_path / "worker.log", concurrency=2)
        beat = start_beat(tmp_path / "beat.log", tmp_path / "beat-schedule")
        try:
            (relay,) = relays(1, PGAPPNAME=RELAY_APP)
            worker_log = tmp_path / "worker.log"
            wait_for(lambda: " ready." in worker_log.read_text(), 60, "the worker to start")
            samples, stop = Samples(), threading.Event()
            sampler = threading.Thread(
                target=sampling, args=(relay.process.pid, samples, stop), daemon=True
            )
            sampler.start()
            busy_from = timezone.now()

            # when: three waves of ten messages to every destination, an inbound event
            # due for a retry in the second, and webhook_status asked in the third
            for wave in range(WAVES):
                started = time.monotonic()
                admit_wave(destinations, wave)
                if wave == 1:
                    capture_due_retry("evt_starved")
                    due_at = timezone.now()
                if wave == 2:
                    status_seconds, status = status_timed()
                time.sleep(max(0.0, WAVE_SECONDS - (time.monotonic() - started)))
            expected = HEALTHY * WAVES * PER_WAVE
            got: list = []

            def all_arrived() -> bool:
                got.extend(arrivals(fleet["control"]))
                return len({key for _, number, key in got if number < HEALTHY}) >= expected

            wait_for(all_arrived, 180, "every healthy merchant's messages")
            busy_until = timezone.now()
            stop.set()
            sampler.join(timeout=10)
        finally:
            beat.terminate()
            beat.wait(timeout=30)
            worker.send_signal(9)
            worker.wait(timeout=30)

    # then: every healthy message arrived once
    healthy = Counter(key for _, number, key in got if number < HEALTHY)
    assert len(healthy) == expected and set(healthy.values()) == {1}, healthy.most_common(3)
    # and: the relay held its configured connections and a fixed few threads throughout
    assert 0 < max(samples.relay_connections) <= RELAY_CONNECTIONS, samples.relay_connections
    assert max(samples.relay_threads) <= RELAY_THREADS, samples.relay_thread_names
    # and: the inbound retry ran on time
    retried = FailedEvent.objects.get(event_key="evt_starved")
    assert retried.status == FailureStatus.RESOLVED, (retried.status, retried.errors)
    assert retried.resolved_at is not None
    retry_after_due = (retried.resolved_at - due_at).total_seconds()
    assert retry_after_due <= BEAT_SECONDS + LATE_SECONDS
    # and: beat's heartbeat and the silence check ran every interval, give or take
    heartbeat_gap = largest_gap(samples.heartbeats, busy_from, busy_until)
    silence_gap = largest_gap(samples.silence_checks, busy_from, busy_until)
    assert max(heartbeat_gap, silence_gap) <= BEAT_SECONDS + LATE_SECONDS
    # and: webhook_status answered within seconds, having read every part, a relay seen
    assert status_seconds <= 10, status_seconds
    assert status["unread"] == [] and status["relay"]["age_seconds"] <= 30, status
    print(
        f"\n{expected} healthy deliveries in {(busy_until - busy_from).total_seconds():.1f} s; "
        f"relay: at most {max(samples.relay_connections)} connections, "
        f"{max(samples.relay_threads)} threads; all connections at most "
        f"{max(samples.all_connections)}; retry {retry_after_due:.1f} s after due; "
        f"heartbeat gap {heartbeat_gap:.1f} s, silence-check gap {silence_gap:.1f} s; "
        f"webhook_status {status_seconds:.1f} s"
    )
