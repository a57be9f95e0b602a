"""What a relay round costs the database: on PostgreSQL one statement claims a round and
one records it, and a run reads nothing else (docs/outbox.md, "A round in two
statements"); on SQLite, whose writers one IMMEDIATE transaction serialises, three
each. And the one claim stays exact under concurrency: a claim that waited for the
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
from webhook_receiver.outbound.relay.claim import relay_claim
from webhook_receiver.outbound.relay.record import relay_record
from webhook_receiver.outbound.relay.run import relay_destination
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


@pytest.mark.postgres_only("one statement a claim and a record")
@pytest.mark.django_db(transaction=True)
def test_a_run_of_one_message_is_its_claim_its_record_and_the_claim_that_finds_nothing(
    receiver,
):
    dest = destination(receiver.url)
    admit(dest, ["k1"], committed=True)

    with statements() as sent:
        relay_destination(destination_id=dest.pk)

    # no read of the destination besides the claim's, no savepoint
    assert [s.split()[0] for s in sent] == ["WITH", "WITH", "WITH"], sent
    assert OutboxMessage.objects.get().status == "delivered"


@pytest.mark.postgres_only("one statement a claim and a record")
@pytest.mark.django_db(transaction=True)
def test_a_backlog_costs_two_statements_a_round_of_ten(receiver):
    dest = destination(receiver.url, rate_count=100, burst=100, max_in_flight=10)
    admit(dest, [f"k{n:02}" for n in range(30)], committed=True)

    with statements() as sent:
        delivered, _ = relay_destination(destination_id=dest.pk)

    # three rounds of ten: a claim each, a record each, and the claim that finds nothing
    assert delivered == 30
    assert len(sent) == 7


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
            relay_destination(destination_id=987654)
