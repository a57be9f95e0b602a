"""Reconciliation's repair items in tests: a source reconciled through a custom adapter
(the sender's list from the test's options, with a redeliver hook that records what it
is asked), the items a run finds, and an admin action posted on them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.failing import CRASH, fail_crash
from tests.support.reconciling import reconcile_with
from webhook_receiver.models import RepairItem
from webhook_receiver.reconcile.run import reconciliation_run

CHANGELIST = reverse("admin:webhook_receiver_repairitem_changelist")
redelivery_requests: list[list[str]] = []


def listing(*, options, since, until):
    """A custom adapter: the sender's list from the test's options, with a redeliver hook."""
    yield [_event(record) for record in options["RECORDS"] if since <= _created(record) < until]


def _redeliver(*, options, event_ids):
    redelivery_requests.append(list(event_ids))


listing.redeliver = _redeliver


def _created(record):
    from datetime import datetime

    return datetime.fromisoformat(record["created_at"])


def _event(record):
    from webhook_receiver.reconcile.adapters import parse_event

    return parse_event(record)


@pytest.fixture
def repair_items(client, settings, crash_handler) -> dict[str, RepairItem]:
    """A missing item (with its payload) and a failed one (a dead letter that would
    succeed now), found by a run of a source with the custom adapter above."""
    now = timezone.now()
    failed = fail_crash(client, "msg_crashed", order_id="ord_crash")  # dead; would succeed now
    records = [
        {
            "id": "msg_lost",
            "type": "inventory.reserved",
            "created_at": now.isoformat(),
            "data": {"order_id": "ord_lost", "version": 1, "lines": [{"sku": "L", "quantity": 2}]},
        },
        {
            "id": failed.event_key,
            "type": CRASH,
            "created_at": now.isoformat(),
            "data": {"order_id": "ord_crash"},
        },
    ]
    reconcile_with(
        settings,
        "shop",
        ADAPTER="tests.support.repairing.listing",
        OPTIONS={"RECORDS": records},
    )
    run = reconciliation_run(source_slug="shop", now=now + timedelta(minutes=15))
    assert run.outcome == "needs_repair", run.error
    redelivery_requests.clear()
    return {item.kind: item for item in RepairItem.objects.all()}


def act(client, action: str, *items: RepairItem, note: str = "checked with the shop"):
    return client.post(
        CHANGELIST,
        {"action": action, "_selected_action": [i.pk for i in items], "post": "yes", "note": note},
        follow=True,
    )
