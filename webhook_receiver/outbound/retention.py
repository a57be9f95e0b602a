"""Retention of the outbox: delivered and discarded messages go after a while; terminal
ones stay until an operator retries or discards them."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..core.retention import delete_in_batches
from .models import MessageStatus, OutboxMessage, WebhookDestination


def purge_outbox(*, now: datetime | None = None) -> int:
    """Delete, per destination, delivered messages delivered before the cut-off and
    discarded ones discarded before it (with their attempts). The cut-off is
    OUTBOX_RETENTION_DAYS ago, or the destination's replay horizon if that is longer:
    a key the receiving end may still be asked about is never forgotten here first."""
    config = app_settings()
    now = now or timezone.now()
    deleted = 0
    for pk, horizon_days in WebhookDestination.objects.values_list("pk", "replay_horizon_days"):
        cutoff = now - max(config.outbox_retention, timedelta(days=horizon_days))
        old = Q(status=MessageStatus.DELIVERED, delivered_at__lt=cutoff) | Q(
            status=MessageStatus.DISCARDED, discarded_at__lt=cutoff
        )
        deleted += delete_in_batches(
            OutboxMessage.objects.filter(old, destination_id=pk),
            batch_size=config.purge_batch_size,
        )
    return deleted
