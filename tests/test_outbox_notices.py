"""Operational notices through the outbox: terminal deliveries as messages to
OPS_DESTINATION (silence alerts through the "outbox" notifier: tests/test_silence.py)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import TestCase

from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbox import enqueue_webhook
from webhook_receiver.outbox.relay import relay_destination

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(settings) -> WebhookDestination:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "OPS_DESTINATION": "ops"}
    return WebhookDestination.objects.create(name="ops", url="http://127.0.0.1:9/ops")


def test_a_terminal_delivery_is_reported_to_ops_but_ops_never_reports_itself(receiver, ops):
    # given: a merchant that refuses, and the ops destination refusing too
    merchant = WebhookDestination.objects.create(name="merchant", url=receiver.url)
    ops.url = receiver.url
    ops.save()
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(merchant, "order.paid", "order:o1:paid:v1", {"type": "order.paid"})
    receiver.answer(410, key="order:o1:paid:v1")

    # when: the merchant's message becomes terminal, then the ops notice is relayed
    # and refused as well
    relay_destination(destination_id=merchant.pk)
    notice = OutboxMessage.objects.get(destination=ops)
    receiver.answer(403, key=notice.key)
    relay_destination(destination_id=ops.pk)

    # then: one notice naming the failed message, itself terminal, and nothing more
    assert notice.event_type == "outbox.message_failed"
    assert notice.payload["data"]["key"] == "order:o1:paid:v1"
    assert notice.payload["data"]["last_answer"] == "410"
    assert OutboxMessage.objects.filter(destination=ops).count() == 1
    assert OutboxMessage.objects.get(destination=ops).status == "failed"


def test_without_an_ops_destination_nothing_is_sent(receiver, settings):
    merchant = WebhookDestination.objects.create(name="merchant", url=receiver.url)
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(merchant, "order.paid", "k", {})
    receiver.answer(404)

    relay_destination(destination_id=merchant.pk)

    assert list(OutboxMessage.objects.values_list("key", "status")) == [("k", "failed")]
