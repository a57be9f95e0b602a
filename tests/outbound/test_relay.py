"""The relay against a real HTTP receiver on loopback: keys, signatures, outcomes,
order, limits and the breaker."""

from __future__ import annotations

import gc
import time
import weakref
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone
from standardwebhooks import Webhook

from tests.support.outbox import CLOSED_PORT as CLOSED
from tests.support.outbox import OLD_SECRET, SECRET, relay_merchant
from tests.support.worker import wait_for
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import (
    YOUNG_COLLECTION_ALLOCATIONS,
    collector_tuned,
    relay_destination,
)
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record, relay_send
from webhook_receiver.outbound.relay.wakeups import due_destinations

pytestmark = pytest.mark.django_db


def admit(dest, key, ordering_key=None):
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(
            dest,
            "order.paid",
            key,
            {"type": "order.paid", "data": {"key": key}},
            ordering_key=ordering_key,
        )


def later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def test_a_delivery_carries_the_key_and_a_signature_the_library_verifies(receiver):
    # given
    dest = relay_merchant(receiver.url, secrets=[OLD_SECRET, SECRET])
    admit(dest, "order:ord_1:paid:v1")

    # when
    sent, _ = relay_destination(destination_id=dest.pk)

    # then: delivered, once, with the stable key in both headers
    assert sent == 1
    request = receiver.received[0]
    assert (
        request.headers["webhook-id"] == request.headers["idempotency-key"] == "order:ord_1:paid:v1"
    )
    # each secret of a rotation verifies on its own
    for secret in (SECRET, OLD_SECRET):
        assert Webhook(secret).verify(request.body, request.headers) == {
            "type": "order.paid",
            "data": {"key": "order:ord_1:paid:v1"},
        }
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts, message.last_status_code) == ("delivered", 1, 200)
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.number, attempt.status_code) == (1, 200)
    assert WebhookDestination.objects.get().last_success_at is not None


def test_429_with_retry_after_waits_without_losing_its_place_or_its_budget(receiver):
    # given: three attempts failed already; the fourth is answered 429, Retry-After: 120
    dest = relay_merchant(receiver.url)
    admit(dest, "first")
    admit(dest, "second")
    OutboxMessage.objects.filter(key="first").update(attempts=3, failures=3)
    receiver.answer(429, {"Retry-After": "120"}, key="first")

    # when: a round claims both, oldest first
    round_ = relay_claim(destination=dest)
    relay_record(dest, relay_send(dest, round_.claimed))

    # then: "first" waits about 120 s, as pending, its failures unspent
    assert [m.key for m in round_.claimed] == ["first", "second"]
    first = OutboxMessage.objects.get(key="first")
    assert (first.status, first.attempts, first.failures) == ("pending", 4, 3)
    assert later(110) < first.next_attempt_at < later(130)
    # no worker holds it: nothing is in flight, and it is not claimable before then
    assert relay_claim(destination=dest).claimed == []
    # once due, it is claimed again before anything newer: its place was kept
    admit(dest, "third")
    claimed = relay_claim(destination=dest, now=later(125)).claimed
    assert [m.key for m in claimed] == ["first", "third"]
    assert claimed[0].attempt == 5


def test_a_server_error_backs_off_and_the_retry_keeps_the_key(receiver):
    dest = relay_merchant(receiver.url, backoff_base_seconds=10, backoff_cap_seconds=60)
    admit(dest, "order:ord_2:paid:v1")
    receiver.answer(500)

    relay_destination(destination_id=dest.pk)
    message = OutboxMessage.objects.get()
    assert (message.status, message.failures) == ("pending", 1)
    assert message.next_attempt_at <= later(11)

    # when: due again
    OutboxMessage.objects.update(next_attempt_at=timezone.now())
    relay_destination(destination_id=dest.pk)

    # then: delivered, and both requests carried the same key
    assert receiver.keys() == ["order:ord_2:paid:v1", "order:ord_2:paid:v1"]
    assert OutboxMessage.objects.get().status == "delivered"


def test_each_message_of_a_round_is_recorded_by_its_own_answer(receiver):
    # given: four messages to a receiver that answers each its own way, one to a port
    # where nothing listens
    merchant = relay_merchant(receiver.url, max_attempts=2)
    warehouse = relay_merchant("http://127.0.0.1:9/hooks", name="warehouse", max_attempts=1)
    for key in ("refused", "flaky", "paced", "paid"):
        admit(merchant, key)
    admit(warehouse, "unreachable")
    receiver.answer(404, key="refused")
    receiver.answer(503, key="flaky")
    receiver.answer(500, key="flaky")
    receiver.answer(429, {"retry-after": "240"}, key="paced")
    start = timezone.now()

    # when: one round each, then the merchant's next once the flaky one's backoff (at
    # most 2 s) has passed
    for dest, now in ((merchant, start), (warehouse, start), (merchant, later(5))):
        claimed = relay_claim(destination=dest, now=now).claimed
        relay_record(dest, relay_send(dest, claimed), now=now)

    # then: each message as its own answers left it; a failure spends the budget, a
    # Retry-After does not
    rows = {m.key: m for m in OutboxMessage.objects.all()}
    assert {
        key: (m.status, m.attempts, m.failures, m.last_status_code) for key, m in rows.items()
    } == {
        "refused": ("failed", 1, 1, 404),
        "flaky": ("failed", 2, 2, 500),
        "paced": ("pending", 1, 0, 429),
        "paid": ("delivered", 1, 0, 200),
        "unreachable": ("failed", 1, 1, None),
    }
    assert rows["paced"].next_attempt_at == start + timedelta(seconds=240)
    assert rows["unreachable"].last_error.startswith("ConnectError")
    # one attempt row per request, numbered, with what was answered
    attempts = {
        key: list(m.attempt_set.order_by("number").values_list("number", "status_code"))
        for key, m in rows.items()
    }
    assert attempts == {
        "refused": [(1, 404)],
        "flaky": [(1, 503), (2, 500)],
        "paced": [(1, 429)],
        "paid": [(1, 200)],
        "unreachable": [(1, None)],
    }
    assert sorted(receiver.keys()) == ["flaky", "flaky", "paced", "paid", "refused"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_refusal_is_terminal_at_once(receiver, status):
    dest = relay_merchant(receiver.url)
    admit(dest, "k")
    receiver.answer(status)

    relay_destination(destination_id=dest.pk)

    message = OutboxMessage.objects.get()
    assert (message.status, message.last_status_code) == ("failed", status)
    assert len(receiver.received) == 1


def test_attempts_exhausted_is_terminal(receiver):
    dest = relay_merchant(receiver.url, max_attempts=2, backoff_base_seconds=60)
    admit(dest, "k")
    for _ in range(2):
        receiver.answer(502)
        OutboxMessage.objects.update(next_attempt_at=timezone.now())
        relay_destination(destination_id=dest.pk)
    assert OutboxMessage.objects.get().status == "failed"


def test_messages_of_one_ordering_key_go_strictly_one_after_another(receiver):
    # given: two updates of one order, and an unrelated message admitted after them
    dest = relay_merchant(receiver.url)
    admit(dest, "order:o1:paid:v1", ordering_key="order:o1")
    admit(dest, "order:o1:fulfilled:v2", ordering_key="order:o1")
    admit(dest, "order:o2:paid:v1", ordering_key="order:o2")
    receiver.answer(503, {"Retry-After": "60"}, key="order:o1:paid:v1")

    # when: the first of o1 is deferred
    round_ = relay_claim(destination=dest)
    relay_record(dest, relay_send(dest, round_.claimed))

    # then: o1's second waited for it; o2 did not
    assert [m.key for m in round_.claimed] == ["order:o1:paid:v1", "order:o2:paid:v1"]
    assert relay_claim(destination=dest).claimed == []
    # when the first is delivered, the second follows
    first = relay_claim(destination=dest, now=later(61)).claimed
    assert [m.key for m in first] == ["order:o1:paid:v1"]
    relay_record(dest, relay_send(dest, first))
    assert [m.key for m in relay_claim(destination=dest).claimed] == ["order:o1:fulfilled:v2"]


def test_a_failing_destination_does_not_delay_another(receiver):
    down = relay_merchant("http://127.0.0.1:9/refused", name="down", timeout_seconds=1)
    up = relay_merchant(receiver.url, name="up")
    for n in range(3):
        admit(down, f"down-{n}")
    admit(up, "up-0")

    relay_destination(destination_id=down.pk)
    sent, _ = relay_destination(destination_id=up.pk)

    assert sent == 1 and receiver.keys() == ["up-0"]
    assert set(OutboxMessage.objects.filter(destination=down).values_list("status", flat=True)) == {
        "pending"
    }


def test_the_concurrency_limit_counts_leases_on_every_worker(receiver):
    dest = relay_merchant(receiver.url, max_in_flight=2, burst=100, rate_count=100)
    for n in range(5):
        admit(dest, f"k{n}")

    first = relay_claim(destination=dest)
    second = relay_claim(destination=dest)

    assert len(first.claimed) == 2 and second.claimed == []
    # a lease that ran out (a worker that died) frees its slot, and the message returns
    again = relay_claim(destination=dest, now=later(dest.timeout_seconds + 31))
    assert [m.key for m in again.claimed] == ["k0", "k1"]


def test_the_token_bucket_limits_starts_and_says_when_the_next_is_due(receiver):
    dest = relay_merchant(receiver.url, rate_count=2, rate_seconds=1, burst=2, max_in_flight=10)
    for n in range(5):
        admit(dest, f"k{n}")
    now = timezone.now()

    first = relay_claim(destination=dest, now=now)
    assert len(first.claimed) == 2
    empty = relay_claim(destination=dest, now=now)
    # the next run is for a round's worth (the burst of 2, at 2/s), not the next token
    assert empty.claimed == [] and 0.9 < empty.wait <= 1.0
    assert len(relay_claim(destination=dest, now=now + timedelta(seconds=0.5)).claimed) == 1


def test_a_bucket_a_few_ulps_short_of_a_whole_token_holds_it(receiver):
    # a refill's float arithmetic (0.9999999999999982 + 1.0) must not cost a claim a token
    dest = relay_merchant(receiver.url, rate_count=5, rate_seconds=1, burst=10, max_in_flight=10)
    for n in range(5):
        admit(dest, f"k{n}")
    now = timezone.now()
    WebhookDestination.objects.filter(pk=dest.pk).update(tokens=0.9999999999999982, tokens_at=now)

    assert len(relay_claim(destination=dest, now=now + timedelta(seconds=0.2)).claimed) == 2


def test_the_breaker_opens_after_consecutive_failures_and_one_probe_decides(receiver):
    dest = relay_merchant(receiver.url, breaker_threshold=2, breaker_cooldown_seconds=30)
    for n in range(3):
        admit(dest, f"k{n}")
    receiver.answer(500)
    receiver.answer(500)

    round_ = relay_claim(destination=dest, limit=2)
    relay_record(dest, relay_send(dest, round_.claimed))

    dest.refresh_from_db()
    assert dest.consecutive_failures == 2 and dest.paused_until > timezone.now()
    assert relay_claim(destination=dest).claimed == []
    # after the cool-down: one probe only
    probe = relay_claim(destination=dest, now=later(31)).claimed
    assert len(probe) == 1
    relay_record(dest, relay_send(dest, probe))
    dest.refresh_from_db()
    assert dest.consecutive_failures == 0 and dest.paused_until is None


# --- with a real relay process -----------------------------------------------------------


@pytest.mark.postgres_only("a relay process must see the test database")
@pytest.mark.django_db(transaction=True)
def test_commit_wakes_a_real_relay_process_at_once(receiver, relays):
    # given: a relay whose poll would take a minute: only the admission's notification
    # can wake it in time
    dest = relay_merchant(receiver.url)
    (relay,) = relays(1, WEBHOOK_RELAY_POLL_SECONDS="60")

    # when: a message is admitted and its transaction commits
    with transaction.atomic():
        enqueue_webhook(dest, "order.paid", "order:ord_5:paid:v1", {"type": "order.paid"})
    admitted = time.monotonic()

    # then: delivered at once, and recorded
    wait_for(lambda: receiver.received, 10, f"the delivery ({relay.tail()})")
    wait_for(OutboxMessage.objects.filter(status="delivered").exists, 10, "the record")
    assert receiver.received[0].at - admitted < 1.0
    assert receiver.keys() == ["order:ord_5:paid:v1"]


@pytest.mark.postgres_only("a relay process must see the test database")
@pytest.mark.django_db(transaction=True)
def test_a_relay_that_cannot_listen_finds_the_message_at_its_poll(receiver, relays):
    # given: a relay that does not listen (as behind PgBouncer in transaction mode)
    dest = relay_merchant(receiver.url)
    (relay,) = relays(1, WEBHOOK_RELAY_LISTEN="false", WEBHOOK_RELAY_POLL_SECONDS="0.5")

    # when
    with transaction.atomic():
        enqueue_webhook(dest, "order.paid", "order:ord_6:paid:v1", {"type": "order.paid"})
    admitted = time.monotonic()

    # then: its poll found it within a poll's interval
    wait_for(lambda: receiver.received, 10, f"the delivery ({relay.tail()})")
    assert receiver.received[0].at - admitted < 1.5
    assert "listening" not in relay.tail()


@pytest.mark.postgres_only("pg_stat_activity shows which sessions hold a transaction open")
@pytest.mark.django_db(transaction=True)
def test_no_transaction_is_open_while_a_request_is_in_flight(receiver):
    import time

    from django.db import connections

    # given: a receiver that holds each request 0.2 s, then looks for sessions of this
    # database with a transaction that began before the request came and is still open
    # (the run records an answer that came while others are in flight: a transaction of
    # a statement, never one that waits for a merchant)
    dest = relay_merchant(receiver.url, max_in_flight=3)
    for n in range(3):
        admit(dest, f"k{n}")
    open_transactions: list[int] = []

    def look(headers):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            arrived = cursor.fetchone()[0]
            time.sleep(0.2)
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid() "
                "AND xact_start < %s",
                [arrived],
            )
            open_transactions.append(cursor.fetchone()[0])
        connections["default"].close()

    receiver.on_request = look

    # when
    sent, _ = relay_destination(destination_id=dest.pk)

    # then: three requests, none of them with a transaction open across it
    assert sent == 3
    assert open_transactions == [0, 0, 0]


@pytest.mark.postgres_only("another session holding the destination's row lock")
@pytest.mark.django_db(transaction=True)
def test_a_run_leaves_a_destination_to_the_worker_already_claiming_for_it(receiver):
    import threading

    from django.db import connections

    dest = relay_merchant(receiver.url)
    admit(dest, "k0")
    locked, release = threading.Event(), threading.Event()

    def claimer_holding_the_row():
        try:
            with transaction.atomic():
                WebhookDestination.objects.select_for_update().get(pk=dest.pk)
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=claimer_holding_the_row)
    holder.start()
    locked.wait(10)
    try:
        # when: a trigger's run meets the busy row
        started = time.monotonic()
        sent, wait = relay_destination(destination_id=dest.pk)
        took = time.monotonic() - started
    finally:
        release.set()
        holder.join()

    # then: it left at once, sending nothing; the holder's run (or the next) sends it
    assert (sent, wait) == (0, None) and took < 1.0
    assert receiver.received == []
    assert relay_destination(destination_id=dest.pk)[0] == 1


def test_the_poll_finds_each_destination_with_something_due_once():
    # a backlog of many due messages is one destination to wake, not one per message
    first = relay_merchant(CLOSED, name="first")
    second = relay_merchant(CLOSED, name="second")
    idle = relay_merchant(CLOSED, name="idle")
    for n in range(6):
        admit(first, f"a{n}")
    for n in range(3):
        admit(second, f"b{n}")
    OutboxMessage.objects.create(
        destination=idle,
        key="later",
        event_type="order.paid",
        payload={},
        status="pending",
        next_attempt_at=later(60),
        created_at=timezone.now(),
    )

    assert due_destinations() == [first.pk, second.pk]


def test_the_poll_leaves_a_destination_its_breaker_paused_until_the_pause_ends():
    # given: two destinations with messages due, one paused by its breaker for a minute
    paused = relay_merchant(CLOSED, name="paused")
    open_ = relay_merchant(CLOSED, name="open")
    admit(paused, "a1")
    admit(open_, "b1")
    WebhookDestination.objects.filter(pk=paused.pk).update(
        consecutive_failures=10, paused_until=later(60)
    )

    # when / then: the poll wakes the open one only
    assert due_destinations() == [open_.pk]

    # once the pause has ended, the next poll wakes the paused one for its probe
    WebhookDestination.objects.filter(pk=paused.pk).update(paused_until=later(-1))
    assert due_destinations() == [paused.pk, open_.pk]


@pytest.mark.django_db(False)
def test_a_relay_process_collects_its_garbage_less_often_and_still_collects_cycles():
    """relay_serve tunes its process's collector (collector_tuned): start-up's objects
    frozen, the youngest generation collected every YOUNG_COLLECTION_ALLOCATIONS
    allocations; a cycle made afterwards still goes."""

    class Node:
        pass

    before = gc.get_threshold()
    try:
        collector_tuned()
        assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, *before[1:])
        assert gc.get_freeze_count() > 0
        node = Node()
        node.itself = node  # type: ignore[attr-defined]
        gone = weakref.ref(node)
        del node
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
