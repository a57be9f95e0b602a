"""What a relay round costs the database: on PostgreSQL one statement records the answers
that came and claims what replaces them, and a run reads nothing else (docs/sending.md,
"A round in one statement"); on SQLite, whose writers one IMMEDIATE transaction
serialises, three to record and three to claim. The one statement sees what it records:
a message it delivers frees its slot and its ordering key, a breaker it opens claims
nothing. And the claim stays exact under concurrency: a claim that waited for the
destination's lock counts the leases of the claim it waited for."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import TestCase
from django.utils import timezone

from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import destination_relay
from webhook_receiver.outbound.relay.round import lease_margin
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record
from webhook_receiver.outbound.relay.transport import relay_send

pytestmark = pytest.mark.django_db
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# statements to claim a round, and to record one, per database
CLAIM_STATEMENTS = {"postgresql": 1, "sqlite": 3}
RECORD_STATEMENTS = {"postgresql": 1, "sqlite": 3}


def destination(url: str, **fields) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name=fields.pop("name", "merchant"), url=url, secrets=[SECRET], **fields
    )


def admit(dest: WebhookDestination, keys: list[str], *, committed: bool = False) -> None:
    if committed:
        with transaction.atomic():
            for key in keys:
                enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})
        return
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        for key in keys:
            enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})


@contextmanager
def statements() -> Iterator[list[str]]:
    """The statements sent through Django's cursor, as the evaluation counts them: the
    transaction's bounds (set_config) are not work of their own; savepoints are."""
    sent: list[str] = []

    def count(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        if not sql.lstrip().upper().startswith("SELECT SET_CONFIG"):
            sent.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        yield sent


def test_a_round_is_claimed_in_one_statement_and_recorded_in_one(receiver):
    # given: three messages due, answered 200, 500 and 429 with Retry-After (a success
    # closes the breaker, the other two count or pace)
    dest = destination(receiver.url)
    admit(dest, ["k1", "k2", "k3"])
    receiver.answer(200, key="k1")
    receiver.answer(500, key="k2")
    receiver.answer(429, {"Retry-After": "60"}, key="k3")

    # when
    with statements() as claiming:
        round_ = relay_claim(destination=dest)
    results = relay_send(dest, round_.claimed)
    with statements() as recording:
        relay_record(dest, results)

    # then
    assert len(claiming) == CLAIM_STATEMENTS[connection.vendor], claiming
    assert len(recording) == RECORD_STATEMENTS[connection.vendor], recording
    statuses = dict(OutboxMessage.objects.values_list("key", "status"))
    assert statuses == {"k1": "delivered", "k2": "pending", "k3": "pending"}
    assert DeliveryAttempt.objects.count() == 3
    # the claim returned the destination's row, its secrets readable
    assert round_.destination is not None and round_.destination.secrets == [SECRET]


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_run_of_one_message_is_its_claim_and_its_record_with_the_claim_that_finds_nothing(
    receiver,
):
    dest = destination(receiver.url)
    admit(dest, ["k1"], committed=True)

    with statements() as sent:
        destination_relay(destination_id=dest.pk)

    # no read of the destination besides the claim's, no savepoint
    assert [s.split()[0] for s in sent] == ["WITH", "WITH"], sent
    assert OutboxMessage.objects.get().status == "delivered"


def backlog_relayed(receiver, keys: list[str], max_in_flight: int) -> tuple[int, list[str]]:
    """``keys`` admitted, committed, to a destination with ``max_in_flight`` requests at
    most (and a rate that holds none back), and relayed in one run: how many it delivered,
    and the statements it sent."""
    dest = destination(receiver.url, rate_count=100, burst=100, max_in_flight=max_in_flight)
    admit(dest, keys, committed=True)

    with statements() as sent:
        delivered, _ = destination_relay(destination_id=dest.pk)
    return delivered, sent


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_backlog_one_request_at_a_time_costs_a_statement_a_delivery_and_one_more(receiver):
    # given: one request in flight at most: each answer's statement claims the next
    delivered, sent = backlog_relayed(receiver, [f"k{n}" for n in range(5)], max_in_flight=1)

    # the first claim, then one statement an answer (the last claims nothing)
    assert delivered == 5
    assert len(sent) == 6
    assert receiver.keys() == [f"k{n}" for n in range(5)]


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_backlog_costs_at_most_a_statement_a_delivery(receiver):
    delivered, sent = backlog_relayed(receiver, [f"k{n:02}" for n in range(30)], max_in_flight=10)

    # each statement records at least one answer: answers come back together, so fewer
    assert delivered == 30
    assert len(sent) <= 31
    assert OutboxMessage.objects.filter(status="delivered").count() == 30


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_the_statement_that_delivers_a_message_claims_the_next_of_its_ordering_key(receiver):
    # given: two moves of one order; the second waits for the first
    dest = destination(receiver.url, max_in_flight=5)
    with transaction.atomic():
        for key in ("order:o1:paid:v1", "order:o1:fulfilled:v2"):
            enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"}, ordering_key="o1")

    with statements() as sent:
        delivered, _ = destination_relay(destination_id=dest.pk)

    # the first claim, the first's record with the second's claim, the second's record
    assert delivered == 2 and len(sent) == 3
    assert receiver.keys() == ["order:o1:paid:v1", "order:o1:fulfilled:v2"]


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_the_statement_that_opens_the_breaker_claims_nothing(receiver):
    # given: a threshold of one failure, and two messages, one request at a time
    dest = destination(receiver.url, max_in_flight=1, breaker_threshold=1)
    admit(dest, ["k1", "k2"], committed=True)
    receiver.answer(500, key="k1")

    with statements() as sent:
        delivered, _ = destination_relay(destination_id=dest.pk)

    # the first answer pauses the destination: the statement that records it claims
    # nothing, and k2 is never sent
    assert delivered == 1 and len(sent) == 2
    assert receiver.keys() == ["k1"]
    dest.refresh_from_db()
    assert dest.paused_until is not None and dest.consecutive_failures == 1
    assert OutboxMessage.objects.get(key="k2").status == "pending"


@pytest.mark.parametrize("held", ["disabled", "paused"])
def test_a_paused_or_disabled_destination_costs_its_claim_alone(receiver, held):
    fields = (
        {"enabled": False}
        if held == "disabled"
        else {"paused_until": timezone.now() + timedelta(seconds=60), "consecutive_failures": 10}
    )
    dest = destination(receiver.url, **fields)
    admit(dest, ["k1"])

    with statements() as sent:
        round_ = relay_claim(destination=dest)

    # the row read (and, on PostgreSQL, locked) and nothing written, on either database
    assert round_.claimed == [] and round_.wait is None and len(sent) == 1


@pytest.mark.postgres_only("two sessions contending for the destination's row")
@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_the_lock_counts_the_leases_of_the_claim_it_waited_for(
    receiver,
):
    # given: two requests in flight at most, plenty of tokens, four messages due; one
    # worker has claimed one and not yet committed, holding the destination's row
    dest = destination(receiver.url, max_in_flight=2, rate_count=100, burst=100)
    admit(dest, ["k0", "k1", "k2", "k3"], committed=True)
    claimed, commit = threading.Event(), threading.Event()
    first: list[list[str]] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                round_ = relay_claim(destination=dest.pk, limit=1)
                first.append([m.key for m in round_.claimed])
                claimed.set()
                commit.wait(10)
        finally:
            connections.close_all()

    worker = threading.Thread(target=holder)
    worker.start()
    assert claimed.wait(10)

    # when: a second claim waits for the row, and the first commits meanwhile
    second: list[list[str]] = []

    def waiter() -> None:
        try:
            second.append([m.key for m in relay_claim(destination=dest.pk).claimed])
        finally:
            connections.close_all()

    other = threading.Thread(target=waiter)
    other.start()
    wait_for_a_lock_wait()
    commit.set()
    worker.join(10)
    other.join(10)

    # then: its snapshot predated the first claim's commit, so it was taken again: one
    # in flight already, so it claims one (not two, nor none)
    assert first == [["k0"]]
    assert second == [["k1"]]
    assert OutboxMessage.objects.filter(status="sending").count() == 2


def wait_for_a_lock_wait() -> None:
    """Until another session of this database waits for a row lock."""
    deadline = time.monotonic() + 10
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("no session waited for the destination's lock")


@pytest.mark.parametrize("caller", ["claim", "run"])
def test_a_destination_that_does_not_exist_is_not_found(caller):
    # the claim says so (a run no longer reads the destination with a get of its own)
    with pytest.raises(WebhookDestination.DoesNotExist):
        if caller == "claim":
            relay_claim(destination=987654)
        else:
            destination_relay(destination_id=987654)


@pytest.mark.parametrize(
    ("lock_ms", "statement_ms", "margin"),
    [(2000, 5000, 24), (300, 800, 6.3), (0, 5000, 30), (2000, 0, 30)],
    ids=["default bounds", "short bounds", "no lock bound", "no statement bound"],
)
def test_a_lease_outlives_its_request_by_three_bounded_statements_and_a_slack(
    settings, receiver, lock_ms, statement_ms, margin
):
    # given: the statements' bounds (0: none, and then the margin of old)
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "LOCK_TIMEOUT_MS": lock_ms,
        "STATEMENT_TIMEOUT_MS": statement_ms,
    }
    dest = destination(receiver.url, timeout_seconds=4)
    admit(dest, ["k1"])
    now = timezone.now()

    # when
    round_ = relay_claim(destination=dest, now=now)

    # then: the claim's, the one the run is in when the answer comes, and the answer's
    # record may each wait their bounds; then 3 s
    assert lease_margin() == timedelta(seconds=margin)
    leased = OutboxMessage.objects.get(key="k1")
    assert [m.key for m in round_.claimed] == ["k1"]
    assert leased.lease_until == now + timedelta(seconds=4 + margin)
