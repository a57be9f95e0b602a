"""Operational notices through the outbox: terminal deliveries as messages to
OPS_DESTINATION (silence alerts through the "outbox" notifier: tests/watch/test_silence.py)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import TestCase

from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination

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
    receiver.answer(404, key="order:o1:paid:v1")

    # when: the merchant's message becomes terminal, then the ops notice is relayed
    # and refused as well
    relay_destination(destination_id=merchant.pk)
    notice = OutboxMessage.objects.get(destination=ops)
    receiver.answer(403, key=notice.key)
    relay_destination(destination_id=ops.pk)

    # then: one notice naming the failed message, itself terminal, and nothing more
    assert notice.event_type == "outbox.message_failed"
    assert notice.payload["data"]["key"] == "order:o1:paid:v1"
    assert notice.payload["data"]["last_answer"] == "404"
    assert OutboxMessage.objects.filter(destination=ops).count() == 1
    assert OutboxMessage.objects.get(destination=ops).status == "failed"


def test_without_an_ops_destination_nothing_is_sent(receiver, settings):
    merchant = WebhookDestination.objects.create(name="merchant", url=receiver.url)
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(merchant, "order.paid", "k", {})
    receiver.answer(404)

    relay_destination(destination_id=merchant.pk)

    assert list(OutboxMessage.objects.values_list("key", "status")) == [("k", "failed")]


def test_a_notice_for_a_message_with_the_longest_key_is_admitted_and_the_round_recorded(
    receiver, ops
):
    # given: a refused message whose key has the 255 characters a key may have, and a
    # delivered one in the same round
    merchant = WebhookDestination.objects.create(name="merchant-" + "m" * 90, url=receiver.url)
    long_key = "order:" + "o" * 249
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(merchant, "order.paid", long_key, {"type": "order.paid"})
        enqueue_webhook(merchant, "order.paid", "order:o2:paid:v1", {"type": "order.paid"})
    receiver.answer(404, key=long_key)

    # when
    relay_destination(destination_id=merchant.pk)

    # then: both answers recorded, and the notice admitted under a key that fits
    statuses = dict(OutboxMessage.objects.filter(destination=merchant).values_list("key", "status"))
    assert statuses == {long_key: "failed", "order:o2:paid:v1": "delivered"}
    notice = OutboxMessage.objects.get(destination=ops)
    assert len(notice.key) <= 255
    assert notice.payload["data"]["key"] == long_key
