"""``manage.py webhook_status`` and ``/health/`` against a database that does not answer:
tables locked by another session (a migration, a VACUUM FULL). Each answers within its
bound, and says why, never OK."""

from __future__ import annotations

import datetime
import http.client
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from tests.support.commands import manage
from tests.support.locks import table_locked
from tests.support.private_servers import PrivatePostgres, private_postgres  # noqa: F401 (fixture)
from tests.support.served import Served, gunicorn  # noqa: F401 (fixture)
from tests.support.signing import event_body, reserved, standard_headers
from tests.support.status import processes_seen
from webhook_receiver.models import WebhookDestination

pytestmark = [
    pytest.mark.postgres_only("a lock held by another session"),
    pytest.mark.django_db(transaction=True),
]

RECEIPTS = "webhook_receiver_webhookreceipt"
OUTBOX = "webhook_receiver_outboxmessage"
HEARTBEAT = "webhook_receiver_heartbeat"
# the lock's longest hold: a tool that waits for it unbounded answers after it
HELD_SECONDS = 12


@pytest.fixture
def one_second(settings) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "STATUS_TIMEOUT_SECONDS": 1}


@contextmanager
def locked(*tables: str) -> Iterator[None]:
    """``tables`` locked ACCESS EXCLUSIVE by another session, for HELD_SECONDS at most."""
    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], host=db["HOST"], port=db["PORT"], user=db["USER"])
    try:
        with table_locked(holder, ", ".join(tables), for_seconds=HELD_SECONDS):
            yield
    finally:
        holder.close()


def status_command() -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    try:
        call_command("webhook_status", stdout=out, stderr=err, no_color=True)
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, out.getvalue(), err.getvalue(), time.monotonic() - started


def app_tables() -> list[str]:
    from webhook_receiver.watch.readings import app_tables

    return [m._meta.db_table for m in app_tables()]


def status_subprocess(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``manage.py webhook_status`` in a process of its own, on the test database; and
    how long it took from its reading the clock (``generated_at``, after Django's
    start, which this shared machine makes vary by seconds) to its exit."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
    }
    started = time.monotonic()
    run = manage("webhook_status", *args, env=env, timeout=60)
    ended = datetime.datetime.now(datetime.UTC)
    if "--json" not in args:
        return run, time.monotonic() - started
    generated_at = datetime.datetime.fromisoformat(json.loads(run.stdout)["generated_at"])
    return run, (ended - generated_at).total_seconds()


@pytest.fixture
def status_baseline(db) -> float:
    """How long the status takes with no lock: what a lock may add to it is the bound
    (3 s, the default)."""
    processes_seen()
    WebhookDestination.objects.create(name="merchant", url="http://127.0.0.1:9/")
    run, took = status_subprocess("--json")
    assert run.returncode == 0, run.stdout + run.stderr
    return took


@pytest.mark.parametrize("table", app_tables())
def test_webhook_status_under_a_lock_on_any_table_names_it_within_its_bound(status_baseline, table):
    # when: the status is asked for while another session holds the table locked
    with locked(table):
        run, took = status_subprocess("--json")
    # its usual time, on this machine as loaded as it is now: the slower of the runs with
    # no lock just before and just after (other test processes come and go meanwhile)
    usual = max(status_baseline, status_subprocess("--json")[1])

    # then: within the bound (3 s) of its usual time, the rest read, the locked part
    # named by what it is and by its table, and never OK
    document = json.loads(run.stdout)
    print(f"\nwebhook_status under a lock on {table}: {took:.2f} s (unlocked {usual:.2f} s)")
    assert took < usual + 3 + 1, took
    assert run.returncode == 3 == document["exit_code"], run.stdout + run.stderr
    assert document["state"] == "unknown"
    assert table in json.dumps(document["unread"])
    assert all(u["why"].startswith("locked") for u in document["unread"])
    assert document["verdict"].startswith("Not read: ")
    assert [s["source"] for s in document["sources"]] == [
        "shop",
        "stripe",
        "github",
        "small",
        "keyed",
    ]
    assert "not read" in run.stderr


def test_webhook_status_reads_as_before_once_the_lock_is_gone(status_baseline):
    with locked(RECEIPTS):
        assert status_subprocess()[0].returncode == 3
    run, _ = status_subprocess()
    assert run.returncode == 0
    assert run.stdout.splitlines()[1] == "OK: All 5 sources and 1 destination OK"


def health(client) -> tuple[int, dict[str, str], float]:
    started = time.monotonic()
    response = client.get("/health/", HTTP_ACCEPT="application/json")
    return response.status_code, response.json(), time.monotonic() - started


def test_health_whose_heartbeat_is_locked_answers_503_and_says_why(client, one_second):
    # given: a fresh heartbeat, and its table locked
    processes_seen()

    # when
    with locked(HEARTBEAT):
        status, body, took = health(client)
    print(f"\n/health/ under a lock on {HEARTBEAT} (1 s bound): {took:.2f} s")

    # then
    assert took < 3
    assert status == 503
    assert body["BeatHeartbeat(name='beat')"] == (
        "Unavailable: cannot read the heartbeat: database not answering within 1 s"
    )
    assert body["Database(alias='default')"] == "OK"
    assert body["Tables()"] == "OK"  # the heartbeat's table is BeatHeartbeat's to name


@pytest.mark.parametrize("table", [t for t in app_tables() if t != HEARTBEAT])
def test_health_under_a_lock_on_any_table_answers_503_naming_it_within_the_bound(client, table):
    # given: a fresh heartbeat; the default bound, 3 s, and the check's own second
    processes_seen()

    # when
    with locked(table):
        status, body, took = health(client)

    # then: degraded, said within the bound, and why
    print(f"\n/health/ under a lock on {table}: {took:.2f} s")
    assert took < 3, took
    assert status == 503
    assert body["Tables()"] == f"Unavailable: locked against reads for 1 s: {table}"
    assert body["BeatHeartbeat(name='beat')"] == "OK"
    # and once the lock is gone, healthy again at once
    assert health(client)[:2] == (200, dict.fromkeys(body, "OK"))


def test_a_metrics_scrape_under_a_receipts_lock_answers_503_within_the_bound(
    client, settings, one_second
):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "METRICS_TOKEN": "t0ken"}
    with locked(RECEIPTS):
        started = time.monotonic()
        response = client.get("/metrics/", HTTP_AUTHORIZATION="Bearer t0ken")
        took = time.monotonic() - started
    assert took < 3
    assert response.status_code == 503


# --- served: deliveries meet the lock, and the probe still gets a worker -----------------


def request(server: Served, method: str, path: str, body: bytes = b"", headers=None):
    started = time.monotonic()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), time.monotonic() - started
    finally:
        conn.close()


def deliver(server: Served, body: bytes, msg_id: str):
    headers = {"Content-Type": "application/json", **standard_headers(body, msg_id=msg_id)}
    return request(server, "POST", "/webhooks/shop/", body, headers)


@pytest.mark.parametrize("table", [RECEIPTS, OUTBOX])
def test_the_overview_under_a_lock_says_it_could_not_look_within_its_bound(
    admin_client, one_second, table
):
    # given: a destination, so that the outbox's figures are read too
    WebhookDestination.objects.create(name="merchant", url="http://127.0.0.1:9/")
    processes_seen()
    url = reverse("admin:webhook_receiver_sourceoverview_changelist")

    # when: the page is asked for while the table is locked
    with locked(table):
        started = time.monotonic()
        answer = admin_client.get(url)
        took = time.monotonic() - started

    print(f"\noverview under a lock on {table} (1 s bound): {took:.2f} s")
    # then: within the bound, 503, the locked part named, the rest shown, and no OK
    page = answer.content.decode()
    assert took < 4
    assert answer.status_code == 503
    assert f"locked ({table}), not read within 1 s" in page
    assert "? Unknown" in page and "All " not in page
    assert "shop" in page  # the sources' rows, read
    # and once the lock is gone, the figures again
    answer = admin_client.get(url)
    assert answer.status_code == 200 and "merchant" in answer.content.decode()


@pytest.mark.parametrize(
    "table, kind, count",
    # a delivery waits the claim's lock bound (2 s) on the receipts, the admission's
    # (200 ms) on the outbox: enough of them to hold both workers for seconds if unbounded
    [(RECEIPTS, "inventory.reserved", 2), (OUTBOX, "order.paid", 10)],
    ids=["receipts locked", "outbox locked"],
)
def test_served_health_answers_within_seconds_while_deliveries_meet_a_lock(
    gunicorn: Served,  # noqa: F811
    table,
    kind,
    count,
):
    # given: a fresh heartbeat; a destination for order events; deliveries that each
    # meet the lock, sent at once to two sync workers, then a probe
    processes_seen()
    WebhookDestination.objects.create(
        name="merchant", url="http://127.0.0.1:9/", event_types=["order.paid"]
    )

    def body(n: int) -> bytes:
        if kind == "order.paid":
            return event_body(kind, order_id=f"o{n}", version=1)
        return reserved(f"o{n}", (f"S{n}", 1))

    with locked(table), ThreadPoolExecutor(count + 1) as pool:
        deliveries = [pool.submit(deliver, gunicorn, body(n), f"msg_{n}") for n in range(count)]
        time.sleep(0.2)  # the deliveries reach the workers first
        probe = pool.submit(request, gunicorn, "GET", "/health/?format=json")
        status, content, took = probe.result()
        answers = [future.result() for future in deliveries]

    print(f"\nserved /health/ under a lock on {table}, deliveries waiting: {took:.2f} s")
    # then: the probe got a worker and its answer within seconds, degraded and why;
    # every delivery was deferred (captured for retry), none held a worker for the lock
    assert took < 5, took
    assert status == 503, content
    assert json.loads(content)["Tables()"] == f"Unavailable: locked against reads for 1 s: {table}"
    assert {status for status, _, _ in answers} == {202}


# --- a database that accepts connections and never answers -------------------------------


def test_webhook_status_against_a_frozen_database_exits_3_within_seconds(
    private_postgres: PrivatePostgres,  # noqa: F811
):
    # given: the server frozen (SIGSTOP): the kernel still accepts the connection, and
    # nothing ever answers it
    pid = int((private_postgres.data / "postmaster.pid").read_text().split()[0])
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": private_postgres.url,
        "SHOP_WEBHOOK_SECRETS": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    }
    os.kill(pid, signal.SIGSTOP)
    try:
        # when
        started = time.monotonic()
        run = manage("webhook_status", env=env, timeout=60)
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)

    # then: the connection attempt gave up within the demo's connect_timeout (5 s)
    assert run.returncode == 3, run.stderr
    assert "not read: source records: database error (ConnectionTimeout)" in run.stderr
    print(f"\nwebhook_status against a frozen database: {took:.2f} s")
    assert took < 15


def test_a_retry_held_by_a_lock_on_the_receipts_is_not_said_to_be_stopped(one_second):
    # given: a retry overdue, and the receipts locked (as a flood under a lock left
    # them): every retry meets the lock and is deferred, whether or not the sweep runs
    from datetime import timedelta

    from django.utils import timezone

    from tests.support.status import failed

    now = timezone.now()
    failed("shop", "retrying", first=now - timedelta(minutes=40), due=now - timedelta(seconds=90))

    # when
    with locked(RECEIPTS):
        code, out, err, took = status_command()

    # then: still an alert, naming the lock rather than a stopped worker
    assert code == 2, out + err
    assert "retries held by the receipts" in out
    assert "retries not running" not in out
    assert took < 8
