"""The story the trace tests tell, made the way production makes it: signed deliveries
to the real endpoint (one applied and delivered twice, an order paid then fulfilled, one
failing into a dead letter through the real retry sweep) and a real reconciliation run
over a file export, which finds the dead one as a repair item."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support import handlers
from tests.support.failing import CRASH, fail_crash
from tests.support.http import post
from tests.support.outbox import destination
from tests.support.reconciling import reconcile_with
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.inbound.failures import retry_failed_events
from webhook_receiver.models import FailedEvent, RepairItem
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.reconcile.run import reconciliation_run

APPLIED = "msg_trace_applied"
PAID = "msg_trace_paid"
FULFILLED = "msg_trace_fulfilled"
DEAD = "msg_trace_dead"
ORDER = "ord_trace"


@dataclass(frozen=True)
class Story:
    applied_body: bytes


@pytest.fixture
def shop_effects(settings) -> None:
    """The demo's hook, as project/settings.py sets it (tests/settings.py leaves it out)."""
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "TRACE_EFFECTS": "project.shop.trace.shop_effects",
    }


def deliver(client, msg_id: str, body: bytes) -> dict:
    response = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    assert response.status_code in (200, 202), response.content
    return response.json()


@pytest.fixture
def story(client, crash_handler, settings, tmp_path) -> Story:
    """An applied reservation delivered twice, an order paid then fulfilled, and an event
    that failed on delivery, failed again on its retry, and is dead; reconciliation then
    found the dead one as a repair item."""
    applied_body = reserved(ORDER, ("SKU-RED", 2), ("SKU-BLUE", 1))
    assert deliver(client, APPLIED, applied_body)["status"] == "applied"
    assert deliver(client, APPLIED, applied_body)["status"] == "duplicate"
    deliver(client, PAID, event_body("order.paid", order_id=ORDER, version=2))
    deliver(client, FULFILLED, event_body("order.fulfilled", order_id=ORDER, version=3))

    # fails on delivery (retrying, two attempts allowed), then on its retry: dead
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "RETRY_MAX_ATTEMPTS": 2}
    fail_crash(client, DEAD, order_id=ORDER)
    handlers.failures_left["count"] = 1
    assert retry_failed_events(now=timezone.now() + timedelta(days=1)) == 1
    assert FailedEvent.objects.get(event_key=DEAD).status == "dead"

    # the sender lists all four: reconciliation finds the dead one, as a repair item
    now = timezone.now()
    sent = [
        (APPLIED, "inventory.reserved"),
        (PAID, "order.paid"),
        (FULFILLED, "order.fulfilled"),
        (DEAD, CRASH),
    ]
    export = tmp_path / "events.jsonl"
    export.write_text(
        "".join(
            json.dumps({"id": key, "type": kind, "created_at": now.isoformat(), "data": {}}) + "\n"
            for key, kind in sent
        )
    )
    reconcile_with(settings, "shop", ADAPTER="file", OPTIONS={"PATH": str(export)})
    reconciliation_run(source_slug="shop", now=now + timedelta(minutes=15))
    assert list(RepairItem.objects.values_list("kind", "event_key")) == [("failed", DEAD)]
    return Story(applied_body=applied_body)


# what a model reports of the summary it wrote: kept beside the message, never sent
MODEL_METADATA = {"prompt_version": "v3", "tokens": 812}


@pytest.fixture
def summarised(story) -> None:
    """The paid order's handler also admitted, to a "merchant" destination, a summary a
    model wrote (with its metadata) and the paid event itself (with none)."""
    merchant = destination("merchant")
    payload = {"type": "order.summary", "data": {"order_id": ORDER}}
    origin = ("shop", PAID)
    summary = f"summary:{ORDER}:v2"
    enqueue_webhook(
        merchant, "order.summary", summary, payload, origin=origin, metadata=MODEL_METADATA
    )
    enqueue_webhook(merchant, "order.paid", f"order:{ORDER}:paid:v2", payload, origin=origin)


@pytest.fixture
def filtered(story) -> None:
    """The paid order's handler also admitted it, from the point of sale, to "picky", a
    destination whose filter wants the web channel only: the filter discarded it."""
    picky = destination("picky", filter={"metadata.channel": "web"})
    payload = {"type": "order.paid", "data": {"order_id": ORDER, "status": "paid", "version": 2}}
    enqueue_webhook(
        picky,
        "order.paid",
        f"order:{ORDER}:paid:v2",
        payload,
        origin=("shop", PAID),
        metadata={"channel": "pos"},
    )
