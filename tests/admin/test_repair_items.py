"""Reconciliation's repair items in the admin: which action each permission offers,
and the confirmation page that asks for a note. (What each action does:
tests/reconcile/test_repair.py.)"""

from __future__ import annotations

import json

import pytest

from tests.support.repairing import CHANGELIST, act
from webhook_receiver.models import RepairItem, WebhookReceipt

pytestmark = pytest.mark.django_db


def offered_actions(client) -> set[str]:
    form = client.get(CHANGELIST).context["action_form"]  # None: no action at all
    return set() if form is None else {v for v, _ in form.fields["action"].choices} - {""}


def test_view_permission_alone_offers_no_repair(client, staff_user, repair_items):
    client.force_login(staff_user("view_repairitem"))

    assert offered_actions(client) == set()
    act(client, "apply_selected", repair_items["missing"])
    assert not WebhookReceipt.objects.filter(event_key="msg_lost").exists()
    assert RepairItem.objects.get(pk=repair_items["missing"].pk).status == "open"


def test_each_permission_offers_its_action(client, staff_user, repair_items):
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


def test_the_confirmation_page_lists_the_items_and_asks_for_a_note(
    client, staff_user, repair_items
):
    client.force_login(staff_user("view_repairitem", "apply_repairitem"))

    page = client.post(
        CHANGELIST, {"action": "apply_selected", "_selected_action": [repair_items["missing"].pk]}
    )

    assert page.status_code == 200
    text = page.content.decode()
    assert "msg_lost" in text and "Fetch and apply (1)" in text and 'name="note"' in text
    assert (
        json.loads(json.dumps(repair_items["missing"].sender_says))["data"]["order_id"]
        == "ord_lost"
    )
