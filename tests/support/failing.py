"""Deliveries that fail on purpose, through the real endpoint."""

from __future__ import annotations

from tests.support import handlers
from tests.support.http import post
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.models import FailedEvent

CRASH = "test.crash"


def fail_crash(client, msg_id: str, order_id: str = "ord_1") -> FailedEvent:
    """A delivery of ``test.crash`` whose handler raises once (transient)."""
    handlers.failures_left["count"] = 1
    body = event_body(CRASH, order_id=order_id)
    response = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    assert response.status_code == 202, response.content
    return FailedEvent.objects.get(source="shop", event_key=msg_id)


def fail_schema(client, msg_id: str, sku: str = "SKU-1") -> FailedEvent:
    """A reservation of quantity 0: a permanent error, dead at once."""
    body = reserved("ord_bad", (sku, 0))
    response = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    assert response.json()["status"] == "dead_lettered"
    return FailedEvent.objects.get(source="shop", event_key=msg_id)


def snapshot(failed: FailedEvent) -> tuple:
    """What an operator's action may change on a failed event, read afresh: its status
    first, who last replayed it fourth."""
    failed.refresh_from_db()
    return (
        failed.status,
        failed.attempts,
        len(failed.errors),
        failed.last_replayed_by,
        failed.last_replayed_at,
        failed.discarded_by,
        failed.resolution,
    )
