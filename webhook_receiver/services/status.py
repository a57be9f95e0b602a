"""Selectors for watching the receiver: what each source has been doing.

Every read here is an index range, so that silence checks, metrics scrapes and the
overview stay cheap however large the tables grow.
"""

from __future__ import annotations

from datetime import datetime

from ..models import FailedEvent, WebhookReceipt


def last_accepted_at(source: str) -> datetime | None:
    """When ``source`` last sent an event we accepted: a new event's receipt, or a
    verified event held as a failed event. (A redelivered duplicate is not news.)

    Two index lookups: receipts by (source, received_at), failed events by
    (source, first_attempt_at).
    """
    received = (
        WebhookReceipt.objects.filter(source=source)
        .order_by("-received_at")
        .values_list("received_at", flat=True)
        .first()
    )
    captured = (
        FailedEvent.objects.filter(source=source)
        .order_by("-first_attempt_at")
        .values_list("first_attempt_at", flat=True)
        .first()
    )
    moments = [m for m in (received, captured) if m is not None]
    return max(moments) if moments else None
