"""The outbox's retention (``outbound.retention``): delivered and discarded messages go
after OUTBOX_RETENTION_DAYS, never before their destination's replay horizon; failed ones
stay for an operator."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.retention import purge_outbox

pytestmark = pytest.mark.django_db


def admit(dest, key):
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        return enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})


def test_retention_keeps_terminal_messages_and_respects_the_replay_horizon(settings):
    # given: two destinations, one whose receiving end remembers keys for 90 days
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "OUTBOX_RETENTION_DAYS": 30}
    short = WebhookDestination.objects.create(name="short", url="http://127.0.0.1:9/")
    long = WebhookDestination.objects.create(
        name="long", url="http://127.0.0.1:9/", replay_horizon_days=90
    )
    old = timezone.now() - timedelta(days=45)
    for dest in (short, long):
        for key, status in (("delivered", "delivered"), ("failed", "failed"), ("new", "delivered")):
            admit(dest, key)
            OutboxMessage.objects.filter(destination=dest, key=key).update(
                status=status, delivered_at=old if key != "new" else timezone.now()
            )
        admit(dest, "discarded")
        OutboxMessage.objects.filter(destination=dest, key="discarded").update(
            status="discarded", discarded_at=old
        )

    # when
    deleted = purge_outbox()

    # then: 45-day-old delivered and discarded messages go for the 30-day destination
    # only; terminal and recent ones stay everywhere
    assert deleted == 2
    kept = set(OutboxMessage.objects.values_list("destination__name", "key"))
    assert kept == {
        ("short", "failed"),
        ("short", "new"),
        ("long", "delivered"),
        ("long", "failed"),
        ("long", "new"),
        ("long", "discarded"),
    }
