"""What a peer sent, as an operator sees it: every page and command answers with something
readable, whatever the stored bytes (nested deeper than Python recurses, NUL, markup), and
no bidirectional control or invisible character reorders or hides what is shown. (The
rule itself and the JSON printer: tests/core/test_display.py.)

Records are made the way production makes them: signed deliveries to the real endpoint,
a real reconciliation run over a file export.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from project.shop.trace import shop_effects
from tests.support.http import post
from tests.support.peer_text import NAMED, OTHER_INVISIBLE, SPOOFED_TYPE, assert_no_invisible, deep
from tests.support.peers import answer, hostile_peer
from tests.support.reconciling import reconcile_with
from tests.support.signing import event_body, standard_headers
from webhook_receiver.admin.cells import trace_url
from webhook_receiver.core.storable import MAX_JSON_DEPTH
from webhook_receiver.models import (
    FailedEvent,
    ReconciliationRun,
    RepairItem,
    RunOutcome,
    WebhookReceipt,
)
from webhook_receiver.reconcile.run import reconciliation_run

pytestmark = pytest.mark.django_db


def deliver(client, msg_id: str, body: bytes) -> dict:
    response = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    assert response.status_code in (200, 202), response.content
    return response.json()


def page(admin_client, url: str) -> str:
    response = admin_client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def change_url(obj) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


def changelist_url(model) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")


# --- stored JSON, however deep ---------------------------------------------------------


def test_a_dead_letter_nested_100000_deep_has_a_readable_page(client, admin_client):
    # given: a verified event whose body nests 100,000 levels deep: dead at once
    body = b'{"type": "inventory.reserved", "data": ' + deep(100_000).encode() + b"}"
    assert deliver(client, "msg_deep", body)["status"] == "dead_lettered"
    failed = FailedEvent.objects.get(event_key="msg_deep")

    # when
    shown = page(admin_client, change_url(failed))

    # then: the body as it came, and the error
    assert "[[[[[[[[" in shown and "RecursionError" in shown


def test_a_receipt_whose_body_is_as_deep_as_could_be_parsed_has_a_readable_page(
    client, admin_client
):
    # given: an event type without a handler (ignored: a receipt) whose data nests as deep
    # as the receive path could parse; the admin's page runs deeper in the stack
    for depth in range(sys.getrecursionlimit(), 0, -10):
        body = b'{"type": "unhandled.deep", "data": ' + deep(depth).encode() + b"}"
        if deliver(client, f"msg_deep_{depth}", body)["status"] == "ignored":
            break
    receipt = WebhookReceipt.objects.get()

    # when / then
    assert "[[[[" in page(admin_client, change_url(receipt))


def test_the_trace_page_and_command_of_a_deep_dead_letter(client, admin_client, settings):
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "TRACE_EFFECTS": "project.shop.trace.shop_effects",
    }
    body = b'{"type": "order.paid", "data": ' + deep(100_000).encode() + b"}"
    deliver(client, "msg_deep_trace", body)

    shown = page(admin_client, trace_url("shop", "msg_deep_trace"))
    out = StringIO()
    call_command("webhook_trace", "msg_deep_trace", stdout=out, no_color=True)

    # the host's hook answered (no error in its place), and the attempts are listed
    assert "raised" not in shown and "RecursionError" in shown
    assert "raised" not in out.getvalue() and "RecursionError" in out.getvalue()


@pytest.mark.parametrize(
    "body",
    [
        event_body("order.paid", order_id="o\u00001", version=1),
        event_body("order.paid", order_id="o" * 5000, version=1),
        b'{"type": "order.paid", "data": ' + deep(100_000).encode() + b"}",
        b'{"type": "order.paid", "data": {"order_id": ' + deep(100_000).encode() + b"}}",
    ],
    ids=["NUL order_id", "5,000-character order_id", "deep data", "deep order_id"],
)
def test_the_shop_hook_answers_for_any_stored_body(client, body):
    # given: a dead letter the shop's handler refused
    assert deliver(client, "msg_hostile", body)["status"] == "dead_lettered"

    # when
    sections = shop_effects(source="shop", event_key="msg_hostile")

    # then: its two sections, nothing found (no order holds such an id)
    assert [s.title for s in sections] == [
        "Inventory ledger lines written by this event",
        "Order state the event concerns",
    ]
    assert all(not s.rows for s in sections)


def test_a_repair_item_whose_sender_record_is_deep_has_a_readable_page(
    client, admin_client, settings, tmp_path
):
    # given: the sender lists an event we never received, its data nested deep
    now = timezone.now()
    record = {"id": "msg_never_came", "type": "order.paid", "created_at": now.isoformat()}
    text = json.dumps(record)[:-1] + ', "data": {"deep": ' + deep(900) + "}}"
    export = tmp_path / "events.jsonl"
    export.write_text(text + "\n")
    reconcile_with(settings, "shop", ADAPTER="file", OPTIONS={"PATH": str(export)})
    reconciliation_run(source_slug="shop", now=now + timedelta(minutes=15))
    item = RepairItem.objects.get(event_key="msg_never_came")

    # when / then: the list and the item's page, the record kept to MAX_JSON_DEPTH levels
    # (read back from its column deep in a page's stack) and the rest said to be cut
    assert "msg_never_came" in page(admin_client, changelist_url(RepairItem))
    shown = page(admin_client, change_url(item))
    assert f"nested deeper than {MAX_JSON_DEPTH} levels: not kept" in shown


# --- invisible characters, wherever a peer's text is shown ------------------------------


# a sender's API answering 400 with text that holds an override
TEXT = {"Content-Type": "text/plain; charset=utf-8"}
REFUSAL = answer(400, TEXT, f"unknown cursor for {SPOOFED_TYPE}".encode())


@pytest.fixture
def spoofed(client, settings) -> dict:
    """A receipt (an ignored type) and a dead letter whose type, key and values hold
    bidirectional controls and invisible characters; a failed reconciliation whose
    sender answered with them."""
    body = event_body(SPOOFED_TYPE, note=f"amount{NAMED}{OTHER_INVISIBLE}")
    key = "msg_\u202espoof"
    assert deliver(client, key, body)["status"] == "ignored"
    dead = event_body("order.paid", order_id=f"ord_{NAMED}", version=1)
    assert deliver(client, "msg_\u2067dead", dead)["status"] == "dead_lettered"
    with hostile_peer(lambda request: [(0, REFUSAL)], path="") as sender:
        reconcile_with(settings, "shop", OPTIONS={"URL": sender.url, "RETRIES": 0})
        run = reconciliation_run(source_slug="shop", now=timezone.now())
    assert run.outcome == RunOutcome.FAILED and "\u202e" in run.error
    return {
        "receipt": WebhookReceipt.objects.get(event_key=key),
        "failed": FailedEvent.objects.get(event_key="msg_\u2067dead"),
        "run": run,
    }


def test_admin_lists_and_pages_show_escapes_not_controls(spoofed, admin_client):
    receipt, failed = spoofed["receipt"], spoofed["failed"]
    urls = [
        changelist_url(WebhookReceipt),
        change_url(receipt),
        changelist_url(FailedEvent),
        change_url(failed),
        changelist_url(ReconciliationRun),
        reverse("admin:webhook_receiver_requestaudit_changelist"),
        reverse("admin:webhook_receiver_sourceoverview_changelist"),
        trace_url("shop", receipt.event_key),
        trace_url("shop", failed.event_key),
    ]
    for url in urls:
        shown = page(admin_client, url)
        # a form's values post back what is stored (the trace page's key): left as they are
        assert_no_invisible(re.sub(r'\svalue="[^"]*"', "", shown))
    # the receipts' list, its filter of event types included, reads as stored
    listed = page(admin_client, changelist_url(WebhookReceipt))
    assert "refund.\\u202edeunissi\\u202c.ok" in listed
    assert "msg_\\u202espoof" in listed


def test_stored_values_and_identities_are_unchanged(spoofed, admin_client):
    receipt = spoofed["receipt"]
    receipt.refresh_from_db()
    assert receipt.event_type == SPOOFED_TYPE
    assert receipt.event_key == "msg_\u202espoof"
    # the list's filter link still selects the stored type
    url = changelist_url(WebhookReceipt) + "?event_type=" + SPOOFED_TYPE
    response = admin_client.get(url)
    assert list(response.context["cl"].result_list) == [receipt]
    # and the trace link traces the stored key, which its form posts back as it is
    traced = page(admin_client, trace_url("shop", receipt.event_key))
    assert "1 delivery" in traced
    assert 'name="key" value="msg_\u202espoof"' in traced


def test_the_commands_print_escapes_not_controls(spoofed):
    out = StringIO()
    call_command("webhook_trace", spoofed["receipt"].event_key, stdout=out, no_color=True)
    assert "refund.\\u202edeunissi\\u202c.ok" in out.getvalue()
    assert_no_invisible(out.getvalue().replace("\n", ""))

    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("webhook_status", stdout=out, no_color=True)
    assert "\\u202e" in out.getvalue()
    assert_no_invisible(out.getvalue().replace("\n", ""))

    out = StringIO()
    call_command("replay_dead_letters", "--dry-run", stdout=out, no_color=True)
    assert "msg_\\u2067dead" in out.getvalue()
    assert_no_invisible(out.getvalue().replace("\n", ""))
