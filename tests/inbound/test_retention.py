"""Receipts' retention (``inbound.retention``): receipts older than RECEIPT_RETENTION_DAYS
go, in batches that never hold up a claim; a key still held as a failed event keeps its
receipt; a redelivery of a purged key is applied again, as docs/operations.md says."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.conf import app_settings
from webhook_receiver.exceptions import TransientError
from webhook_receiver.inbound.failures import CapturedEvent, failure_capture
from webhook_receiver.inbound.retention import purge_receipts
from webhook_receiver.models import WebhookReceipt


def receiver_settings(**overrides):
    return override_settings(WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, **overrides})


def deliver(client, key: str, order: str):
    body = reserved(order, ("SKU-R", 1))
    return post(client, "shop", body, standard_headers(body, msg_id=key)).json()["status"]


def age(keys: list[str], days: int) -> None:
    WebhookReceipt.objects.filter(event_key__in=keys).update(
        received_at=timezone.now() - timedelta(days=days)
    )


@pytest.mark.django_db
def test_old_receipts_go_in_batches_and_a_redelivery_of_a_purged_key_applies_again(client):
    # given: seven receipts from 40 days ago, one of them still held as a failed event,
    # and one from yesterday
    old = [f"msg_old_{i}" for i in range(7)]
    for key in [*old, "msg_recent"]:
        assert deliver(client, key, f"ord_{key}") == "applied"
    age(old, 40)
    age(["msg_recent"], 1)
    failure_capture(
        captured=CapturedEvent("shop", "msg_old_6", "inventory.reserved", "msg_old_6", None,
                               reserved("ord_msg_old_6", ("SKU-R", 1)), {}),
        exc=TransientError("a replay of this key is still possible"),
    )  # fmt: skip

    # when: the purge runs, two receipts a statement
    with receiver_settings(RECEIPT_RETENTION_DAYS=35, PURGE_BATCH_SIZE=2):
        deleted = purge_receipts()

    # then: the six old receipts without a failed event went; the rest stayed
    assert deleted == 6
    kept = set(WebhookReceipt.objects.values_list("event_key", flat=True))
    assert kept == {"msg_old_6", "msg_recent"}
    # and: a redelivery of a kept key is a duplicate; of a purged key, applied again
    assert deliver(client, "msg_recent", "ord_msg_recent") == "duplicate"
    assert deliver(client, "msg_old_0", "ord_msg_old_0") == "applied"
    assert InventoryLedgerEntry.objects.filter(event_key="msg_old_0").count() == 2


@pytest.mark.django_db
def test_nothing_within_the_retention_period_is_purged(client):
    for key in ("msg_a", "msg_b"):
        deliver(client, key, f"ord_{key}")
    age(["msg_a"], 34)

    with receiver_settings(RECEIPT_RETENTION_DAYS=35):
        assert purge_receipts() == 0
    assert WebhookReceipt.objects.count() == 2


@pytest.mark.postgres_only("a second connection holds a purge batch open")
@pytest.mark.django_db(transaction=True)
def test_a_purge_batch_held_open_does_not_hold_up_the_claim_of_a_new_event(client):
    # given: old receipts, and a purge batch that has deleted them but not committed
    old = [f"msg_held_{i}" for i in range(20)]
    for key in old:
        deliver(client, key, f"ord_{key}")
    age(old, 40)
    params = connection.get_connection_params()
    with psycopg.connect(**params) as purge:
        purge.execute(
            "DELETE FROM webhook_receiver_webhookreceipt WHERE received_at < %s",
            (timezone.now() - timedelta(days=35),),
        )

        # when: a new event arrives meanwhile
        started = time.monotonic()
        status = deliver(client, "msg_new_during_purge", "ord_new")
        took = time.monotonic() - started
        purge.rollback()

    # then: it was applied at once, not deferred after waiting for the lock (2 s)
    assert status == "applied"
    assert took < 1.0


def test_receipts_must_outlast_every_reconciliation_window():
    shop = settings.WEBHOOK_RECEIVER["SOURCES"]["shop"]
    reconciled = {**shop, "RECONCILE": {"ADAPTER": "file", "LOOKBACK_SECONDS": 3 * 86400}}
    sources = {**settings.WEBHOOK_RECEIVER["SOURCES"], "shop": reconciled}
    too_short = receiver_settings(SOURCES=sources, RECEIPT_RETENTION_DAYS=2)
    with too_short, pytest.raises(ImproperlyConfigured, match="RECEIPT_RETENTION_DAYS.*'shop'"):
        app_settings()
    with receiver_settings(SOURCES=sources, RECEIPT_RETENTION_DAYS=35):
        assert app_settings().receipt_retention == timedelta(days=35)
