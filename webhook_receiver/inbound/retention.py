"""Retention of receipts: the memory of which keys were applied.

A receipt is what turns a redelivery into a duplicate. Once it is purged, a redelivery
of its key is claimed as new and its handler runs again: the built-in order handlers
compare versions and answer stale, but a ledger movement would be booked twice. So
receipts are kept ``RECEIPT_RETENTION_DAYS`` (35), longer than any sender documented
here redelivers, and longer than every reconciliation window (checked at start-up).

A receipt whose key is still held as a failed event stays while that record does: a
replay of a resolved failed event must still find it applied.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef
from django.utils import timezone

from ..conf import app_settings
from ..core.retention import delete_in_batches
from .models import FailedEvent, WebhookReceipt


def purge_receipts(*, now: datetime | None = None, max_batches: int = 1000) -> int:
    """Delete receipts received before the retention period, PURGE_BATCH_SIZE at a time
    (each batch a statement of its own, so a claim never waits on more than one short
    batch); return how many went."""
    config = app_settings()
    cutoff = (now or timezone.now()) - config.receipt_retention
    held = FailedEvent.objects.filter(source=OuterRef("source"), event_key=OuterRef("event_key"))
    old = WebhookReceipt.objects.filter(received_at__lt=cutoff).exclude(Exists(held))
    return delete_in_batches(old, batch_size=config.purge_batch_size, max_batches=max_batches)
