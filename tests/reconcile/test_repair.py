"""Repairing reconciliation's items from the admin: each action behind its permission,
each through its service, each on the item's record."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers as test_handlers
from tests.support.failing import CRASH, fail_crash
from tests.support.reconciling import reconcile_with
from webhook_receiver.models import RepairItem, WebhookReceipt
from webhook_receiver.reconcile.run import reconciliation_run

pytestmark = pytest.mark.django_db

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
def items(client, settings, crash_handler) -> dict[str, RepairItem]:
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
        ADAPTER="tests.reconcile.test_repair.listing",
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


def offered_actions(client) -> set[str]:
    form = client.get(CHANGELIST).context["action_form"]  # None: no action at all
    return set() if form is None else {v for v, _ in form.fields["action"].choices} - {""}


def test_view_permission_alone_offers_no_repair(client, staff_user, items):
    client.force_login(staff_user("view_repairitem"))

    assert offered_actions(client) == set()
    act(client, "apply_selected", items["missing"])
    assert not WebhookReceipt.objects.filter(event_key="msg_lost").exists()
    assert RepairItem.objects.get(pk=items["missing"].pk).status == "open"


def test_each_permission_offers_its_action(client, staff_user, items):
    user = staff_user("view_repairitem", "replay_repairitem", "apply_repairitem")
    client.force_login(user)
    assert offered_actions(client) == {"replay_selected", "apply_selected"}
    staff_user.grant(user, "redeliver_repairitem", "resolve_repairitem")
    assert offered_actions(client) == {
        "replay_selected",
        "apply_selected",
        "redeliver_selected",
        "resolve_selected",
    }


def test_fetch_and_apply_applies_once_and_a_second_click_answers_duplicate(
    client, staff_user, items
):
    # given
    client.force_login(staff_user("view_repairitem", "apply_repairitem"))
    missing = items["missing"]

    # when: applied, then applied again
    first = act(client, "apply_selected", missing)
    second = act(client, "apply_selected", missing)

    # then: one effect; the receipt says who approved it; the item is resolved, with both
    # clicks in its history
    assert "Fetch and apply, 1 item: 1 applied." in first.content.decode()
    assert "1 duplicate" in second.content.decode()
    assert InventoryLedgerEntry.objects.filter(event_key="msg_lost").count() == 1
    receipt = WebhookReceipt.objects.get(event_key="msg_lost")
    assert receipt.headers == {
        "X-Webhook-Receiver-Applied-By": "reconciliation, approved by operator"
    }
    missing.refresh_from_db()
    assert (missing.status, missing.resolved_by) == ("resolved", "operator")
    assert [(h["action"], h["result"], h["by"]) for h in missing.history] == [
        ("fetch and apply", "applied", "operator"),
        ("fetch and apply", "duplicate", "operator"),
    ]
    assert missing.history[0]["note"] == "checked with the shop"


def test_replay_runs_the_failed_event_under_its_key(client, staff_user, items):
    client.force_login(staff_user("view_repairitem", "replay_repairitem"))
    test_handlers.failures_left["count"] = 0  # the handler is fixed

    answer = act(client, "replay_selected", items["failed"])

    assert "1 applied" in answer.content.decode()
    assert InventoryLedgerEntry.objects.filter(event_key="msg_crashed").count() == 1
    items["failed"].refresh_from_db()
    assert items["failed"].status == "resolved"


def test_an_action_on_the_wrong_kind_is_skipped_and_says_why(client, staff_user, items):
    client.force_login(staff_user("view_repairitem", "replay_repairitem"))

    answer = act(client, "replay_selected", items["missing"])

    assert "only a failed item can be replayed" in answer.content.decode()
    assert RepairItem.objects.get(pk=items["missing"].pk).status == "open"


def test_request_redelivery_goes_through_the_adapters_hook(client, staff_user, items):
    client.force_login(staff_user("view_repairitem", "redeliver_repairitem"))

    answer = act(client, "redeliver_selected", items["missing"])

    assert "1 requested" in answer.content.decode()
    assert redelivery_requests == [["msg_lost"]]
    items["missing"].refresh_from_db()
    assert items["missing"].status == "open"  # until a later run finds it received


def test_resolve_needs_a_note(client, staff_user, items):
    client.force_login(staff_user("view_repairitem", "resolve_repairitem"))

    refused = act(client, "resolve_selected", items["missing"], note="  ")
    resolved = act(client, "resolve_selected", items["missing"], note="refunded by hand")

    assert "This field is required" in refused.content.decode()
    assert "1 resolve" in resolved.content.decode()
    items["missing"].refresh_from_db()
    assert (items["missing"].status, items["missing"].resolution_note) == (
        "resolved",
        "refunded by hand",
    )


def test_the_confirmation_page_lists_the_items_and_asks_for_a_note(client, staff_user, items):
    client.force_login(staff_user("view_repairitem", "apply_repairitem"))

    page = client.post(
        CHANGELIST, {"action": "apply_selected", "_selected_action": [items["missing"].pk]}
    )

    assert page.status_code == 200
    text = page.content.decode()
    assert "msg_lost" in text and "Fetch and apply (1)" in text and 'name="note"' in text
    assert json.loads(json.dumps(items["missing"].sender_says))["data"]["order_id"] == "ord_lost"
