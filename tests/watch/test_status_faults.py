"""``manage.py webhook_status`` and ``/health/`` against a database that does not answer:
tables locked by another session (a migration, a VACUUM FULL). Each answers within its
bound, and says why, never OK."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from tests.support.paths import REPO
from tests.support.private_servers import PrivatePostgres, private_postgres  # noqa: F401 (fixture)
from tests.support.served import Served, gunicorn  # noqa: F401 (fixture)
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.models import WebhookDestination
from webhook_receiver.watch.heartbeat import heartbeat_record

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
    holder.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(HELD_SECONDS, holder.rollback)
    release.start()
    try:
        yield
    finally:
        release.cancel()
        holder.rollback()
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


@pytest.mark.parametrize("table", [RECEIPTS, OUTBOX])
def test_webhook_status_under_a_lock_exits_3_within_its_bound(one_second, table):
    # given: a destination, so that the outbox's figures are read too
    WebhookDestination.objects.create(name="merchant", url="http://127.0.0.1:9/")

    # when
    with locked(table):
        code, out, err, took = status_command()

    # then: "could not look" within the bound, and nothing that reads as OK
    assert took < 3
    assert code == 3
    assert err.strip() == (
        "webhook_status: the status could not be read: database not answering within 1 s"
    )
    assert "OK" not in out


def test_webhook_status_reads_as_before_once_the_lock_is_gone(one_second):
    with locked(RECEIPTS):
        assert status_command()[0] == 3
    code, out, _, _ = status_command()
    assert code == 0
    assert out.splitlines()[1] == "OK: All 5 sources OK"


def health(client) -> tuple[int, dict[str, str], float]:
    started = time.monotonic()
    response = client.get("/health/", HTTP_ACCEPT="application/json")
    return response.status_code, response.json(), time.monotonic() - started


def test_health_whose_heartbeat_is_locked_answers_503_and_says_why(client, one_second):
    # given: a fresh heartbeat, and its table locked
    heartbeat_record()

    # when
    with locked(HEARTBEAT):
        status, body, took = health(client)

    # then
    assert took < 3
    assert status == 503
    assert body["BeatHeartbeat(name='beat')"] == (
        "Unavailable: cannot read the heartbeat: database not answering within 1 s"
    )
    assert body["Database(alias='default')"] == "OK"


def test_health_under_locks_on_receipts_and_outbox_answers_at_once(client, one_second):
    # the checks read neither table: what they look at they can see, and say so
    heartbeat_record()
    with locked(RECEIPTS, OUTBOX):
        status, body, took = health(client)
    assert took < 1
    assert (status, set(body.values())) == (200, {"OK"})


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
    url = reverse("admin:webhook_receiver_sourceoverview_changelist")

    # when: the page is asked for while the table is locked
    with locked(table):
        started = time.monotonic()
        answer = admin_client.get(url)
        took = time.monotonic() - started

    # then: within the bound, 503, and no verdict but that it could not look
    page = answer.content.decode()
    assert took < 4
    assert answer.status_code == 503
    assert "database not answering within 1 s" in page
    assert "? Unknown" in page and "All " not in page
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
    heartbeat_record()
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

    # then: the probe got a worker and its answer within seconds; every delivery was
    # deferred (captured for retry), none held a worker for the lock
    assert took < 5, took
    assert status == 200, content
    assert set(json.loads(content).values()) == {"OK"}
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
        run = subprocess.run(
            [sys.executable, "manage.py", "webhook_status"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)

    # then: the connection attempt gave up within the demo's connect_timeout (5 s)
    assert run.returncode == 3, run.stderr
    assert "the status could not be read" in run.stderr
    assert took < 15
