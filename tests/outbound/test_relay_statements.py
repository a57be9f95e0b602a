"""What a relay round costs the database (docs/sending.md, "How a round is claimed and
recorded"): on PostgreSQL, a destination a relay has not read yet costs the read of its
row under lock and one statement that records the answers that came and claims what
replaces them; a destination it has read costs that one statement alone, guarded by the
row's version. On SQLite, whose writers one IMMEDIATE transaction serialises, a read
and a statement for each part. The one statement sees what it records: a message it
delivers frees its slot and its ordering key, a breaker it opens claims nothing. And
the claim stays exact under concurrency: a relay whose kept row another relay's claim
changed reads it again under lock, and counts that claim's leases."""

from __future__ import annotations

import threading
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
from webhook_receiver.outbound.relay.messages import Work
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.outbound.relay.round import relay_round
from webhook_receiver.outbound.relay.rows import Rows
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record, relay_send
from webhook_receiver.outbound.relay.writes import lease_margin

pytestmark = pytest.mark.django_db
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# statements to claim a round, and to record one, per database, for a destination read
# for the first time (the row locked and read, then the write)
CLAIM_STATEMENTS = {"postgresql": 2, "sqlite": 4}
RECORD_STATEMENTS = {"postgresql": 2, "sqlite": 4}


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
    # the round returned the destination's row, its secrets readable
    assert round_.destination is not None and round_.destination.secrets == [SECRET]


@pytest.mark.postgres_only("a round guarded by the row's version")
def test_a_destination_read_once_costs_one_statement_a_round(receiver):
    # given: a relay's rows, and a message due
    dest = destination(receiver.url)
    admit(dest, ["k1", "k2"])
    rows = Rows()

    # when: its first claim, then the record of the answer with the next claim
    with statements() as first:
        (claimed,) = relay_round([Work(dest.pk, (), 1)], rows=rows)[dest.pk].claimed
    answers = relay_send(dest, [claimed])
    with statements() as second:
        outcome = relay_round([Work(dest.pk, answers, 1)], rows=rows)[dest.pk]

    # then: the row read under lock once; the next round is one statement, and the row
    # it kept is the row as written (its bucket, its version)
    assert [s.split()[0] for s in first] == ["SELECT", "WITH"], first
    assert [s.split()[0] for s in second] == ["WITH"], second
    assert [m.key for m in outcome.claimed] == ["k2"] and outcome.recorded == {claimed.id}
    kept, version, _ = rows.get(dest.pk)
    dest.refresh_from_db()
    assert kept.tokens == dest.tokens and kept.tokens_at == dest.tokens_at
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text FROM webhook_receiver_webhookdestination WHERE id = %s", [dest.pk]
        )
        assert cursor.fetchone()[0] == version


@pytest.mark.postgres_only("a round guarded by the row's version")
@pytest.mark.django_db(transaction=True)
def test_a_row_changed_since_it_was_kept_is_read_again_under_lock(receiver):
    # given: a relay's kept row, then an operator's edit of the destination's limits (in
    # a transaction of its own: the version is the transaction that wrote the row)
    dest = destination(receiver.url, max_in_flight=1)
    admit(dest, ["k1", "k2"], committed=True)
    rows = Rows()
    (first,) = relay_round([Work(dest.pk, (), 1)], rows=rows)[dest.pk].claimed
    WebhookDestination.objects.filter(pk=dest.pk).update(max_in_flight=2)

    # when: the next round
    with statements() as sent:
        outcome = relay_round([Work(dest.pk, (), 5)], rows=rows)[dest.pk]

    # then: the guarded statement found the version changed and did nothing; the row
    # was read under lock and the claim made with the new limit (one more in flight)
    assert [s.split()[0] for s in sent] == ["WITH", "SELECT", "WITH"], sent
    assert [m.key for m in outcome.claimed] == ["k2"]
    assert outcome.destination.max_in_flight == 2


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_run_of_one_message_is_its_claim_and_its_record(receiver):
    dest = destination(receiver.url)
    admit(dest, ["k1"], committed=True)

    with statements() as sent:
        relay_destination(destination_id=dest.pk)

    # the row read under lock once, the claim, and the record (with a claim that finds
    # nothing): no other read of the destination, no savepoint
    assert [s.split()[0] for s in sent] == ["SELECT", "WITH", "WITH"], sent
    assert OutboxMessage.objects.get().status == "delivered"


def backlog_relayed(receiver, keys: list[str], max_in_flight: int) -> tuple[int, list[str]]:
    """``keys`` admitted, committed, to a destination with ``max_in_flight`` requests at
    most (and a rate that holds none back), and relayed in one run: how many it delivered,
    and the statements it sent."""
    dest = destination(receiver.url, rate_count=100, burst=100, max_in_flight=max_in_flight)
    admit(dest, keys, committed=True)

    with statements() as sent:
        delivered, _ = relay_destination(destination_id=dest.pk)
    return delivered, sent


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_backlog_one_request_at_a_time_costs_a_statement_a_delivery_and_two_more(receiver):
    # given: one request in flight at most: each answer's statement claims the next
    delivered, sent = backlog_relayed(receiver, [f"k{n}" for n in range(5)], max_in_flight=1)

    # the row's read and the first claim, then one statement an answer (the last claims
    # nothing)
    assert delivered == 5
    assert len(sent) == 7
    assert receiver.keys() == [f"k{n}" for n in range(5)]


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_a_backlog_costs_at_most_a_statement_a_delivery(receiver):
    delivered, sent = backlog_relayed(receiver, [f"k{n:02}" for n in range(30)], max_in_flight=10)

    # each statement records at least one answer: answers come back together, so fewer
    assert delivered == 30
    assert len(sent) <= 32
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
        delivered, _ = relay_destination(destination_id=dest.pk)

    # the row's read and the first claim, the first's record with the second's claim,
    # the second's record
    assert delivered == 2 and len(sent) == 4
    assert receiver.keys() == ["order:o1:paid:v1", "order:o1:fulfilled:v2"]


@pytest.mark.postgres_only("one statement a round")
@pytest.mark.django_db(transaction=True)
def test_the_statement_that_opens_the_breaker_claims_nothing(receiver):
    # given: a threshold of one failure, and two messages, one request at a time
    dest = destination(receiver.url, max_in_flight=1, breaker_threshold=1)
    admit(dest, ["k1", "k2"], committed=True)
    receiver.answer(500, key="k1")

    with statements() as sent:
        delivered, _ = relay_destination(destination_id=dest.pk)

    # the first answer pauses the destination: the statement that records it claims
    # nothing, and k2 is never sent
    assert delivered == 1 and len(sent) == 3
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
def test_a_claim_that_found_the_row_held_leaves_it_and_then_counts_its_leases(receiver):
    # given: two requests in flight at most, plenty of tokens, four messages due; one
    # relay has claimed one and not yet committed, holding the destination's row
    dest = destination(receiver.url, max_in_flight=2, rate_count=100, burst=100)
    admit(dest, ["k0", "k1", "k2", "k3"], committed=True)
    claimed, commit = threading.Event(), threading.Event()
    first: list[list[str]] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                outcome = relay_claim(destination=dest.pk, limit=1)
                first.append([m.key for m in outcome.claimed])
                claimed.set()
                commit.wait(10)
        finally:
            connections.close_all()

    worker = threading.Thread(target=holder)
    worker.start()
    assert claimed.wait(10)

    # when: a second relay's round meets the held row, then the first commits, and the
    # second's next round comes
    busy = relay_round([Work(dest.pk, (), 10)])[dest.pk]
    commit.set()
    worker.join(10)
    after = relay_round([Work(dest.pk, (), 10)])[dest.pk]

    # then: the first round waited for nothing and left the destination to its holder;
    # the next counted the holder's lease: one in flight already, so it claimed one
    assert busy.busy and busy.claimed == []
    assert first == [["k0"]]
    assert [m.key for m in after.claimed] == ["k1"]
    assert OutboxMessage.objects.filter(status="sending").count() == 2


def test_a_destination_that_does_not_exist_is_not_found():
    # the claim says so; a relay's round drops its lane (below)
    with pytest.raises(WebhookDestination.DoesNotExist):
        relay_claim(destination=987654)
    assert relay_round([Work(987654, (), 1)])[987654].missing
    assert relay_destination(destination_id=987654) == (0, None)


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
