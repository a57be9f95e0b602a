"""The outbox's admission when what it leans on fails: its cache (a private Redis,
stopped, then frozen) and its table (locked by another session, with a served receiver
under concurrent requests). Order events are admitted, or deferred fast; inventory
events never wait for them."""

from __future__ import annotations

import http.client
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import redis
from django.db import connection, transaction
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.bench.server import free_port
from tests.support.commands import manage
from tests.support.http import post
from tests.support.private_servers import PrivateRedis, private_redis  # noqa: F401 (fixture)
from tests.support.served import Served, gunicorn  # noqa: F401 (fixture)
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.core.logs import SaidOnce
from webhook_receiver.inbound.failures import retry_failed_events
from webhook_receiver.models import FailedEvent, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import admission, enqueue_webhook

# the cache's outages are said here
OUTAGE_LOGGER = "webhook_receiver.outbound.admission"


@pytest.fixture
def merchant(transactional_db) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name="merchant",
        url="http://127.0.0.1:9/hooks",
        secrets=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        event_types=["order.paid"],
    )


@pytest.fixture
def outages(monkeypatch) -> Iterator[None]:
    """Each test starts with the cache believed up, and retries a failed cache after
    0.2 s instead of 5 (so that a test sees it come back quickly)."""
    outage = admission.cache_outage
    monkeypatch.setattr(outage, "said", SaidOnce())
    monkeypatch.setattr(outage, "retry_at", 0.0)
    monkeypatch.setattr(outage, "RETRY_SECONDS", 0.2)
    yield


@pytest.fixture
def redis_cache(private_redis: PrivateRedis, settings) -> PrivateRedis:  # noqa: F811
    """Django's default cache on the private Redis, with the demo's socket timeouts."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": private_redis.url,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    return private_redis


def paid(client, order_id: str) -> dict:
    body = event_body("order.paid", order_id=order_id, version=1)
    return post(client, "shop", body, standard_headers(body, msg_id=f"msg_{order_id}")).json()


def window_keys(server: PrivateRedis) -> list[bytes]:
    return redis.Redis(port=server.port).keys("*admitted*")


def admission_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == OUTAGE_LOGGER]


@pytest.mark.django_db(transaction=True)
def test_a_cache_outage_admits_order_events_through_the_constraint_and_says_so_once(
    client, merchant, redis_cache, outages, caplog
):
    # given: one order admitted while the cache answers: its window is in Redis
    caplog.set_level(logging.INFO)
    assert paid(client, "ord_1")["status"] == "applied"
    assert len(window_keys(redis_cache)) == 1

    # when: Redis stops, and five more orders arrive, and the first one's logical
    # delivery is admitted again (its window is out of reach now)
    redis_cache.stop()
    answers = [paid(client, f"ord_{n}")["status"] for n in range(2, 7)]
    with transaction.atomic():
        again = enqueue_webhook("merchant", "order.paid", "order:ord_1:paid:v1", {})

    # then: every order applied and forwarded once; the unique constraint answered the
    # re-admission; the outage is one line, not one per event, and no traceback
    assert answers == ["applied"] * 5
    assert not again.created and not again.coalesced
    assert OutboxMessage.objects.count() == 6
    assert not FailedEvent.objects.exists()
    (line,) = admission_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("outbox cache not answering: redis.exceptions.")
    assert "unique constraint alone" in line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]

    # and when Redis is back, the next admission says so, and the window works again
    redis_cache.start()
    time.sleep(0.3)  # past the outage's retry delay
    assert paid(client, "ord_7")["status"] == "applied"
    back = admission_lines(caplog)[1:]
    assert [r.levelno for r in back] == [logging.INFO]
    assert "answers again after" in back[0].getMessage()
    assert len(window_keys(redis_cache)) == 1  # the new one (the old ones went with Redis)


@pytest.mark.django_db(transaction=True)
def test_a_frozen_cache_costs_one_timeout_not_one_per_event(
    client, merchant, redis_cache, outages, caplog, monkeypatch
):
    # given: Redis stops answering without closing its sockets (SIGSTOP: a hung host)
    caplog.set_level(logging.INFO)
    assert paid(client, "ord_0")["status"] == "applied"  # the pool holds a connection now
    os.kill(redis_cache.process.pid, signal.SIGSTOP)
    try:
        # when: five orders arrive within the outage's retry delay
        monkeypatch.setattr(admission.cache_outage, "RETRY_SECONDS", 60)
        started = time.monotonic()
        answers = [paid(client, f"ord_{n}")["status"] for n in range(1, 6)]
        took = time.monotonic() - started
    finally:
        os.kill(redis_cache.process.pid, signal.SIGCONT)

    # then: all applied; the first met the socket timeout (0.5 s), the others skipped
    # the cache
    assert answers == ["applied"] * 5
    assert took < 2.5
    (line,) = admission_lines(caplog)
    assert "TimeoutError" in line.getMessage()


ADMIT_THREE = """
import time
from django.db import transaction
from webhook_receiver.outbound import enqueue_webhook
started = time.monotonic()
for n in range(3):
    with transaction.atomic():
        enqueue_webhook("merchant", "order.paid", f"order:o{n}:paid:v1", {})
print(f"took {time.monotonic() - started:.2f}")
"""


@pytest.mark.postgres_only("another process admits on the test database")
def test_an_admission_does_not_need_the_broker(merchant):
    # given: a process whose broker is a closed port (Redis down), the demo's settings
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
        "SHOP_WEBHOOK_SECRETS": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    }

    # when: it admits three messages, each in a transaction of its own
    run = manage("shell", "-c", ADMIT_THREE, env=env, timeout=120)

    # then: all admitted, at once, and nothing was asked of the broker (the relays are
    # woken by the database: pg_notify, or their poll)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.split()[-1]) < 2
    assert OutboxMessage.objects.count() == 3
    assert "broker" not in run.stderr and "Traceback" not in run.stderr, run.stderr


# --- the outbox table locked, under a served receiver ----------------------------------


def interleaved(*kinds: list) -> list:
    return [item for items in zip(*kinds, strict=True) for item in items]


def deliver(server: Served, body: bytes, msg_id: str) -> tuple[int, str, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", **standard_headers(body, msg_id=msg_id)}
        conn.request("POST", "/webhooks/shop/", body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode()
        return response.status, text, time.monotonic() - started
    finally:
        conn.close()


@pytest.mark.postgres_only("a lock held by another session; the served app shares the database")
def test_a_locked_outbox_defers_order_events_fast_and_inventory_events_keep_flowing(
    gunicorn: Served,  # noqa: F811
    merchant,
    broker,  # the retries' relay triggers land there
):
    # given: another session holds the outbox table (a migration), for 20 s at most
    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], host=db["HOST"], port=db["PORT"], user=db["USER"])
    holder.execute("LOCK TABLE webhook_receiver_outboxmessage IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(20, holder.rollback)
    release.start()
    orders = [(event_body("order.paid", order_id=f"o{n}", version=1), f"pay_{n}") for n in range(8)]
    stock = [(reserved(f"i{n}", (f"S{n}", 1)), f"res_{n}") for n in range(8)]
    try:
        # when: eight order events and eight inventory events arrive at once, at a
        # receiver of two sync workers
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            # interleaved, so that neither kind goes first
            pending = [pool.submit(deliver, gunicorn, *e) for e in interleaved(orders, stock)]
            results = [future.result() for future in pending]
        took = time.monotonic() - started
    finally:
        release.cancel()
        holder.rollback()
        holder.close()

    # then: the order events were deferred within the admission's bound (200 ms each),
    # the inventory events applied, and no worker was held for the claim's 2 s bound
    paid_answers, stock_answers = results[0::2], results[1::2]
    assert {(status, '"deferred"' in text) for status, text, _ in paid_answers} == {(202, True)}
    assert {(status, '"applied"' in text) for status, text, _ in stock_answers} == {(200, True)}
    assert took < 5, took
    assert max(seconds for *_, seconds in stock_answers) < 5
    assert all("lock timeout" in f.last_error_message for f in FailedEvent.objects.all())
    assert InventoryLedgerEntry.objects.count() == 8

    # and once the lock is gone, the retries forward each order event once
    assert retry_failed_events(now=timezone.now() + timezone.timedelta(days=1)) == 8
    assert OutboxMessage.objects.count() == 8
