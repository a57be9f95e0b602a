"""The outbox's operating services, as the admin calls them: retry now, discard, and
recover a destination's failures since a moment. Records are written with known values
(tests/support/outbox.py); the wake-up each one sends the relays is heard as a relay
hears it (LISTEN)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from tests.support.outbox import destination, failed, listening, message
from webhook_receiver.models import MessageStatus, OutboxMessage
from webhook_receiver.outbound.operations import (
    message_discard,
    message_retry_now,
)
from webhook_receiver.outbound.tenancy import EVERY_TENANT

pytestmark = pytest.mark.django_db


def test_retry_now_makes_failed_and_pending_messages_due_with_a_fresh_budget():
    # given: one message in each status, two destinations
    merchant, warehouse = destination("merchant-7"), destination("warehouse")
    later = timezone.now() + timedelta(hours=1)
    rows = {
        "failed": failed(merchant, "k-failed", last_attempt_at=timezone.now()),
        "pending": message(warehouse, "k-pending", attempts=3, failures=3, next_attempt_at=later),
        "delivered": message(merchant, "k-delivered", MessageStatus.DELIVERED, attempts=1),
        "discarded": message(merchant, "k-discarded", MessageStatus.DISCARDED),
        "sending": message(merchant, "k-sending", MessageStatus.SENDING, lease_until=later),
    }
    now = timezone.now()

    # when
    changed = message_retry_now(
        scope=EVERY_TENANT, message_ids=[r.pk for r in rows.values()], by="alice", now=now
    )

    # then: failed and pending are due now, with no lease and no failures spent
    assert changed == sorted([rows["failed"].pk, rows["pending"].pk])
    for name in ("failed", "pending"):
        row = OutboxMessage.objects.get(pk=rows[name].pk)
        assert (row.status, row.next_attempt_at, row.lease_until, row.failures) == (
            MessageStatus.PENDING,
            now,
            None,
            0,
        )
        assert row.attempts == rows[name].attempts  # the history goes on from where it was
    # the others are as they were
    for name in ("delivered", "discarded", "sending"):
        assert OutboxMessage.objects.get(pk=rows[name].pk).status == rows[name].status


@pytest.mark.postgres_only("LISTEN/NOTIFY")
@pytest.mark.django_db(transaction=True)
def test_an_operators_retry_wakes_the_relays_of_the_destinations_it_touched_once_it_commits():
    # given: failed messages of two destinations, and a relay listening
    merchant, warehouse = destination("merchant-7"), destination("warehouse")
    rows = [
        failed(merchant, "k-1", last_attempt_at=timezone.now()),
        failed(merchant, "k-2", last_attempt_at=timezone.now()),
        failed(warehouse, "k-3", last_attempt_at=timezone.now()),
    ]
    with listening() as heard:
        # when: a retry that rolls back, then one that commits
        with pytest.raises(RuntimeError), transaction.atomic():
            message_retry_now(scope=EVERY_TENANT, message_ids=[rows[0].pk], by="alice")
            raise RuntimeError("changed my mind")
        assert heard() == []
        with transaction.atomic():
            message_retry_now(scope=EVERY_TENANT, message_ids=[r.pk for r in rows], by="alice")

        # then: one notification per destination touched, after the commit
        assert sorted(heard()) == sorted([merchant.pk, warehouse.pk])


@pytest.mark.postgres_only("LISTEN/NOTIFY")
@pytest.mark.django_db(transaction=True)
def test_nothing_to_retry_wakes_nothing():
    merchant = destination("merchant-7")
    row = message(merchant, "k-delivered", MessageStatus.DELIVERED)

    with listening() as heard:
        with transaction.atomic():
            changed = message_retry_now(scope=EVERY_TENANT, message_ids=[row.pk], by="alice")

        assert changed == [] and heard() == []


def test_discard_needs_a_reason_and_records_who_why_and_when():
    # given
    merchant = destination("merchant-7")
    rows = [
        failed(merchant, "k-failed", last_attempt_at=timezone.now() - timedelta(hours=2)),
        message(merchant, "k-pending"),
        message(merchant, "k-delivered", MessageStatus.DELIVERED),
    ]
    ids = [r.pk for r in rows]

    # a blank reason is refused, and changes nothing
    with pytest.raises(ValueError, match="needs a reason"):
        message_discard(scope=EVERY_TENANT, message_ids=ids, by="alice", reason="  \n")
    assert OutboxMessage.objects.filter(status=MessageStatus.DISCARDED).count() == 0

    # when
    now = timezone.now()
    changed = message_discard(
        scope=EVERY_TENANT, message_ids=ids, by="alice", reason=" order cancelled ", now=now
    )

    # then: the failed and the pending one; the delivered one stays delivered
    assert changed == ids[:2]
    for row in OutboxMessage.objects.filter(pk__in=ids[:2]):
        assert (row.status, row.discarded_by, row.discard_reason, row.next_attempt_at) == (
            MessageStatus.DISCARDED,
            "alice",
            "order cancelled",
            now,
        )
    assert OutboxMessage.objects.get(pk=ids[2]).status == MessageStatus.DELIVERED
