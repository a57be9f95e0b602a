"""Repairing reconciliation's items, each action through the admin as an operator takes
it: fetch and apply applies once, replay runs the failed event under its key, an action
on the wrong kind is skipped, a redelivery goes through the adapter's hook, a resolve
needs a note; each on the item's record. (Who is offered which action:
tests/admin/test_repair_items.py.)"""

from __future__ import annotations

import pytest

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers as test_handlers
from tests.support.repairing import act, redelivery_requests
from webhook_receiver.models import RepairItem, WebhookReceipt

pytestmark = pytest.mark.django_db


def test_fetch_and_apply_applies_once_and_a_second_click_answers_duplicate(
    client, staff_user, repair_items
):
    # given
    client.force_login(staff_user("view_repairitem", "apply_repairitem"))
    missing = repair_items["missing"]

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


def test_replay_runs_the_failed_event_under_its_key(client, staff_user, repair_items):
    client.force_login(staff_user("view_repairitem", "replay_repairitem"))
    test_handlers.failures_left["count"] = 0  # the handler is fixed

    answer = act(client, "replay_selected", repair_items["failed"])

    assert "1 applied" in answer.content.decode()
    assert InventoryLedgerEntry.objects.filter(event_key="msg_crashed").count() == 1
    repair_items["failed"].refresh_from_db()
    assert repair_items["failed"].status == "resolved"


def test_an_action_on_the_wrong_kind_is_skipped_and_says_why(client, staff_user, repair_items):
    client.force_login(staff_user("view_repairitem", "replay_repairitem"))

    answer = act(client, "replay_selected", repair_items["missing"])

    assert "only a failed item can be replayed" in answer.content.decode()
    assert RepairItem.objects.get(pk=repair_items["missing"].pk).status == "open"


def test_request_redelivery_goes_through_the_adapters_hook(client, staff_user, repair_items):
    client.force_login(staff_user("view_repairitem", "redeliver_repairitem"))

    answer = act(client, "redeliver_selected", repair_items["missing"])

    assert "1 requested" in answer.content.decode()
    assert redelivery_requests == [["msg_lost"]]
    repair_items["missing"].refresh_from_db()
    assert repair_items["missing"].status == "open"  # until a later run finds it received


def test_resolve_needs_a_note(client, staff_user, repair_items):
    client.force_login(staff_user("view_repairitem", "resolve_repairitem"))

    refused = act(client, "resolve_selected", repair_items["missing"], note="  ")
    resolved = act(client, "resolve_selected", repair_items["missing"], note="refunded by hand")

    assert "This field is required" in refused.content.decode()
    assert "1 resolve" in resolved.content.decode()
    repair_items["missing"].refresh_from_db()
    assert (repair_items["missing"].status, repair_items["missing"].resolution_note) == (
        "resolved",
        "refunded by hand",
    )
