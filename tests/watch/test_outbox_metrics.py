"""The outbox's metrics on /metrics/: stored state read from the database, and what
admission and the relay counted."""

from __future__ import annotations

import os
import signal
import socket
from datetime import timedelta

import httpx
import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from tests.support.metrics import parse, scrape, value
from tests.support.worker import start_relay, wait_for
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.watch.destinations import destination_statuses

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("metrics_on")]


def admit(dest, key):
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        return enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})


def test_backlog_failures_in_flight_and_the_breaker_equal_the_tables(client):
    # given: a destination with two pending messages (one due for 90 s), one terminal,
    # one in flight of a limit of 4, and its breaker open
    dest = WebhookDestination.objects.create(
        name="merchant",
        url="http://127.0.0.1:9/",
        max_in_flight=4,
        paused_until=timezone.now() + timedelta(seconds=60),
    )
    for key in ("a", "b", "c", "d"):
        admit(dest, key)
    now = timezone.now()
    OutboxMessage.objects.filter(key="a").update(created_at=now - timedelta(seconds=90))
    OutboxMessage.objects.filter(key="b").update(next_attempt_at=now + timedelta(seconds=60))
    OutboxMessage.objects.filter(key="c").update(status="failed")
    OutboxMessage.objects.filter(key="d").update(
        status="sending", lease_until=now + timedelta(seconds=30)
    )
    WebhookDestination.objects.create(name="idle", url="http://127.0.0.1:9/")

    # when
    samples = scrape(client)

    # then
    def gauge(name, destination="merchant"):
        return value(samples, f"webhook_receiver_outbox_{name}", destination=destination)

    assert gauge("backlog") == 3
    assert gauge("failed") == 1
    assert gauge("in_flight") == 1
    assert gauge("limiter_utilisation") == 0.25
    assert gauge("breaker_open") == 1
    assert 89 <= gauge("oldest_eligible_age_seconds") < 120
    # a destination with nothing still has its series
    assert (gauge("backlog", "idle"), gauge("breaker_open", "idle")) == (0, 0)


def test_messages_held_back_by_a_failed_one_are_counted_apart_from_the_oldest_due(client):
    # given: one order's first message failed (terminal) 20 minutes ago; its later two
    # wait behind it, due for as long; another order's message is due for 30 s
    dest = WebhookDestination.objects.create(name="merchant", url="http://127.0.0.1:9/")
    for key in ("o1:paid", "o1:cancelled", "o1:fulfilled"):
        with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
            enqueue_webhook(dest, "order.paid", key, {"k": key}, ordering_key="o1")
    admit(dest, "o2:paid")
    now = timezone.now()
    OutboxMessage.objects.filter(ordering_key="o1").update(created_at=now - timedelta(minutes=20))
    OutboxMessage.objects.filter(key="o1:paid").update(status="failed")
    OutboxMessage.objects.filter(key="o2:paid").update(created_at=now - timedelta(seconds=30))

    # when
    samples = scrape(client)

    # then: the held-back two have a gauge of their own; the oldest due is the one the
    # relay would send now, not the ones waiting for an operator
    def gauge(name):
        return value(samples, f"webhook_receiver_outbox_{name}", destination="merchant")

    assert gauge("held_back") == 2
    assert (gauge("backlog"), gauge("failed")) == (3, 1)
    assert 29 <= gauge("oldest_eligible_age_seconds") < 120


def test_not_sending_is_the_status_own_condition(client):
    # given: "stopped" has a message due for 2 min and no answer for 10 min; "sending"
    # has one due as long and answered 5 s ago (behind its limit, not stopped); "fresh"
    # has one due 5 s ago, within the relay's pickup (about 30 s)
    now = timezone.now()
    for name, answered, due in (
        ("stopped", timedelta(minutes=10), timedelta(minutes=2)),
        ("sending", timedelta(seconds=5), timedelta(minutes=2)),
        ("fresh", timedelta(minutes=10), timedelta(seconds=5)),
    ):
        dest = WebhookDestination.objects.create(
            name=name, url="http://127.0.0.1:9/", last_success_at=now - answered
        )
        # last changed an hour ago: a change gives the relay a pickup's time
        WebhookDestination.objects.filter(pk=dest.pk).update(updated_at=now - timedelta(hours=1))
        admit(dest, f"{name}-1")
        OutboxMessage.objects.filter(key=f"{name}-1").update(
            created_at=now - due, next_attempt_at=now - due
        )

    # when
    samples = scrape(client)

    # then: 1 exactly where the status says relay_not_sending
    def not_sending(destination):
        return value(samples, "webhook_receiver_outbox_not_sending", destination=destination)

    assert (not_sending("stopped"), not_sending("sending"), not_sending("fresh")) == (1, 0, 0)
    codes = {d.name: [r.code for r in d.reasons] for d in destination_statuses()}
    assert codes == {"stopped": ["relay_not_sending"], "sending": ["behind"], "fresh": []}


def test_dedup_hits_deliveries_and_terminal_failures_are_counted(
    client, receiver, django_capture_on_commit_callbacks
):
    dest = WebhookDestination.objects.create(name="counted", url=receiver.url)
    before = scrape(client)

    admit(dest, "k1")
    admit(dest, "k1")  # a duplicate admission
    admit(dest, "k2")
    receiver.answer(404, key="k2")
    # the test's transaction never commits: the commit is played by hand
    with django_capture_on_commit_callbacks() as on_commit:
        relay_destination(destination_id=dest.pk)
    uncommitted = scrape(client)
    for callback in on_commit:
        callback()
    after = scrape(client)

    def delta(samples, name):
        return value(samples, name, destination="counted") - value(
            before, name, destination="counted"
        )

    assert delta(after, "webhook_receiver_outbox_dedup_hits_total") == 1
    assert delta(after, "webhook_receiver_outbox_delivery_seconds_count") == 1
    assert delta(after, "webhook_receiver_outbox_attempts_per_delivery_sum") == 1
    assert delta(after, "webhook_receiver_outbox_terminal_total") == 1
    # a round's answers are counted once they are committed, not before
    assert delta(uncommitted, "webhook_receiver_outbox_delivery_seconds_count") == 0
    assert delta(uncommitted, "webhook_receiver_outbox_terminal_total") == 0


@pytest.mark.postgres_only("a relay in another process must see the test database")
@pytest.mark.django_db(transaction=True)
def test_a_relay_serves_its_counters_itself(receiver, tmp_path):
    # given: a relay told to serve its metrics, and a destination that refuses one of
    # three messages
    port = _free_port()
    dest = WebhookDestination.objects.create(name="merchant", url=receiver.url)
    receiver.answer(404, key="k3")
    log = tmp_path / "relay.log"
    relay = start_relay(log, "--metrics-port", str(port))
    try:
        wait_for(lambda: "relay started" in log.read_text(), 60, "the relay to start")

        # when: three messages commit, and the relay relays them
        with transaction.atomic():
            for key in ("k1", "k2", "k3"):
                enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})
        settled = OutboxMessage.objects.filter(status__in=["delivered", "failed"])
        wait_for(lambda: settled.count() == 3, 30, f"three answers ({log.read_text()[-2000:]})")

        # then: its port serves what it counted
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relay.wait(10)
    samples = parse(response.text)
    merchant = {"destination": "merchant"}
    assert value(samples, "webhook_receiver_outbox_delivery_seconds_count", **merchant) == 2
    assert value(samples, "webhook_receiver_outbox_attempts_per_delivery_sum", **merchant) == 2
    assert value(samples, "webhook_receiver_outbox_terminal_total", **merchant) == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serving_a_workers_metrics_without_a_directory_says_what_to_set(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from webhook_receiver.watch.metrics import worker_metrics_serve

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)

    with pytest.raises(ImproperlyConfigured, match="PROMETHEUS_MULTIPROC_DIR"):
        worker_metrics_serve(_free_port())
