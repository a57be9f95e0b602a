"""Trace one webhook: event_trace, the admin's trace page, manage.py webhook_trace, and
the page in a real browser.

Every record is made the way production makes it: signed deliveries to the real endpoint
(one applied and delivered twice, one moving an order, one failing into a dead letter
through the real retry sweep) and a real reconciliation run over a file export.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from tests.support import handlers
from tests.support.browser import screenshot
from tests.support.failing import CRASH, fail_crash
from tests.support.http import post
from tests.support.reconciling import reconcile_with
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.admin.cells import trace_url
from webhook_receiver.inbound.failures import failed_events_retry_due
from webhook_receiver.models import FailedEvent, RepairItem
from webhook_receiver.reconcile.run import reconciliation_run
from webhook_receiver.watch.trace import EffectSection, event_key_sources, event_trace

APPLIED = "msg_trace_applied"
PAID = "msg_trace_paid"
FULFILLED = "msg_trace_fulfilled"
DEAD = "msg_trace_dead"
ORDER = "ord_trace"


@dataclass(frozen=True)
class Story:
    applied_body: bytes


@pytest.fixture(autouse=True)
def _shop_effects(settings) -> None:
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
    assert failed_events_retry_due(now=timezone.now() + timedelta(days=1)) == 1
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


def effect(trace, title_start: str) -> EffectSection:
    (section,) = [s for s in trace.effects if s.title.startswith(title_start)]
    return section


# --- event_trace -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_applied_event_has_every_delivery_its_receipt_and_its_ledger_lines(story):
    # when
    trace = event_trace(source="shop", event_key=APPLIED)

    # then: both deliveries, oldest first
    assert trace.found
    assert [(d.result, d.response_status) for d in trace.deliveries] == [
        ("applied", 200),
        ("duplicate", 200),
    ]
    assert all(d.verification == "verified" for d in trace.deliveries)
    assert trace.deliveries[0].body_size == len(story.applied_body)
    assert trace.deliveries[0].received_at <= trace.deliveries[1].received_at

    # and the receipt, with the first delivery's outcome
    assert trace.receipt is not None
    assert (trace.receipt.status, trace.receipt.subject) == ("applied", ORDER)
    assert trace.receipt.event_type == "inventory.reserved"
    assert trace.receipt.outcome == {"status": "applied", "event_key": APPLIED}

    # and the shop's effects: the two ledger lines, once (the duplicate wrote nothing)
    ledger = effect(trace, "Inventory ledger")
    assert sorted((row[2], row[3], row[4]) for row in ledger.rows) == [
        ("SKU-BLUE", "-1", "reserved"),
        ("SKU-RED", "-2", "reserved"),
    ]
    assert "q=msg_trace_applied" in ledger.admin_url

    # and the order it concerns, which later events moved
    (order,) = effect(trace, "Order state").rows
    assert order[:3] == (ORDER, "fulfilled", "3")
    assert order[4] == f"no: {FULFILLED}"

    # and nothing failed
    assert trace.failed is None
    assert trace.repairs == ()
    assert trace.outbox == ()
    assert trace.summary == "2 deliveries · receipt applied"


@pytest.mark.django_db
def test_the_order_state_says_which_event_set_it(story):
    paid = effect(event_trace(source="shop", event_key=PAID), "Order state").rows
    fulfilled = effect(event_trace(source="shop", event_key=FULFILLED), "Order state").rows

    assert [row[4] for row in paid] == [f"no: {FULFILLED}"]
    assert [row[1:5] for row in fulfilled] == [("fulfilled", "3", fulfilled[0][3], "yes")]


@pytest.mark.django_db
def test_a_dead_event_has_its_attempt_history_and_its_repair_item(story):
    # when
    trace = event_trace(source="shop", event_key=DEAD)

    # then: one delivery, deferred; no receipt; the handler's ledger write rolled back
    assert [(d.result, d.response_status) for d in trace.deliveries] == [("deferred", 202)]
    assert trace.receipt is None
    assert effect(trace, "Inventory ledger").rows == []
    # the order it concerns, read from its stored body (there is no receipt)
    assert [row[4] for row in effect(trace, "Order state").rows] == [f"no: {FULFILLED}"]

    # and the failed event, every attempt, without tracebacks
    failed = trace.failed
    assert failed is not None
    assert (failed.status, failed.attempts, failed.event_type) == ("dead", 2, CRASH)
    assert [(a.attempt, a.trigger, a.kind) for a in failed.history] == [
        (1, "delivery", "transient"),
        (2, "retry", "transient"),
    ]
    assert {a.exception for a in failed.history} == {"builtins.RuntimeError"}
    assert failed.history[0].message == "handler crashed after its ledger write"
    assert all(a.traceback == "" for a in failed.history)
    assert all(a.at is not None for a in failed.history)

    # and the repair item reconciliation opened
    assert [(r.kind, r.status) for r in trace.repairs] == [("failed", "open")]
    assert trace.summary == (
        "1 delivery · no receipt · failed event dead after 2 attempts · 1 repair item(s), 1 open"
    )

    # and the tracebacks only when asked for (the admin page folds them away)
    with_tracebacks = event_trace(source="shop", event_key=DEAD, tracebacks=True)
    assert all("Traceback" in a.traceback for a in with_tracebacks.failed.history)


@pytest.mark.django_db
def test_a_key_nothing_holds_is_an_empty_trace_that_says_so(story):
    trace = event_trace(source="shop", event_key="msg_never_sent")

    assert not trace.found
    assert trace.summary == "nothing holds this key"
    assert (trace.deliveries, trace.receipt, trace.failed, trace.repairs) == ((), None, None, ())
    # the shop's sections are there, and empty
    assert [section.rows for section in trace.effects] == [[], []]
    assert event_key_sources(event_key="msg_never_sent") == []


@pytest.mark.django_db
def test_the_same_key_in_another_source_is_its_own_trace(story):
    # when: the shop's key, traced in a source that never sent it
    trace = event_trace(source="stripe", event_key=APPLIED)

    # then: nothing, not even the shop's rows (which carry the key but not its source)
    assert event_key_sources(event_key=APPLIED) == ["shop"]
    assert not trace.found
    assert [section.rows for section in trace.effects] == [[], []]
    assert effect(trace, "Inventory ledger").note == (
        "Rows with this key belong to source shop, not to this one."
    )


@pytest.mark.django_db
def test_a_hook_that_cannot_be_imported_is_a_message_not_an_error(story, settings):
    # given
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "TRACE_EFFECTS": "nowhere.hook"}

    # when
    trace = event_trace(source="shop", event_key=APPLIED)

    # then: the rest of the story is intact
    assert trace.effects == ()
    assert trace.effects_error.startswith(
        "WEBHOOK_RECEIVER['TRACE_EFFECTS'] = 'nowhere.hook' cannot be imported"
    )
    assert len(trace.deliveries) == 2 and trace.receipt is not None


def exploding_hook(*, source: str, event_key: str) -> list[EffectSection]:
    raise LookupError("the shop's database is elsewhere")


@pytest.mark.django_db
def test_a_hook_that_raises_is_a_message_not_an_error(story, settings):
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "TRACE_EFFECTS": f"{__name__}.exploding_hook",
    }

    trace = event_trace(source="shop", event_key=APPLIED)

    assert trace.effects_error.endswith("raised LookupError: the shop's database is elsewhere")
    assert trace.receipt is not None


# --- the admin page --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_page_tells_the_whole_story_in_order(story, admin_client):
    # when
    response = admin_client.get(trace_url("shop", DEAD))

    # then
    assert response.status_code == 200
    page = response.content.decode()
    sections = [
        "1. Deliveries",
        "2. Receipt",
        "3. Effects",
        "4. Failed event",
        "5. Repair items",
        "6. Outbox",
    ]
    positions = [page.index(title) for title in sections]
    assert positions == sorted(positions)
    assert "handler crashed after its ledger write" in page
    assert "builtins.RuntimeError" in page
    assert "<details><summary>traceback</summary>" in page
    assert "No receipt: this key's effect has not committed." in page
    assert "No outbox messages." in page
    failed = FailedEvent.objects.get(event_key=DEAD)
    assert reverse("admin:webhook_receiver_failedevent_change", args=[failed.pk]) in page
    repair = RepairItem.objects.get(event_key=DEAD)
    assert reverse("admin:webhook_receiver_repairitem_change", args=[repair.pk]) in page


@pytest.mark.django_db
def test_the_admin_page_of_an_applied_event_shows_its_effects(story, admin_client):
    response = admin_client.get(trace_url("shop", APPLIED))

    page = response.content.decode()
    assert response.status_code == 200
    assert "2 deliveries · receipt applied" in page
    assert page.count(">duplicate<") == 1
    assert "SKU-RED" in page and "SKU-BLUE" in page
    assert "Inventory ledger lines written by this event" in page
    assert f"no: {FULFILLED}" in page
    # ages to the second; timestamps in UTC, to the second
    assert " s ago" in page
    receipt_time = event_trace(source="shop", event_key=APPLIED).receipt.received_at
    assert f"{receipt_time:%Y-%m-%d %H:%M:%S}" in page


@pytest.mark.django_db
def test_without_a_source_every_source_holding_the_key_is_traced(story, admin_client):
    response = admin_client.get(reverse("admin:webhook_receiver_trace"), {"key": APPLIED})

    assert response.status_code == 200
    assert [item["trace"].source for item in response.context["traces"]] == ["shop"]


@pytest.mark.django_db
def test_the_admin_page_of_an_unknown_key_says_nothing_holds_it(admin_client):
    response = admin_client.get(trace_url("shop", "msg_nobody"))

    assert response.status_code == 200
    assert "Nothing in source “shop” holds this key" in response.content.decode()

    anywhere = admin_client.get(reverse("admin:webhook_receiver_trace"), {"key": "msg_nobody"})
    assert "No source holds the event key" in anywhere.content.decode()


@pytest.mark.django_db
def test_the_lookup_form_alone(admin_client):
    response = admin_client.get(reverse("admin:webhook_receiver_trace"))

    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="key"' in page
    # the configured sources, and "any source"
    for slug in ("any source", "shop", "stripe", "github"):
        assert f">{slug}</option>" in page


@pytest.mark.django_db
def test_stored_values_are_escaped(client, admin_client):
    # given: a signed delivery whose message id (its event key) is markup
    key = '<img src=x onerror="alert(1)">'
    body = reserved("ord_<b>bold</b>", ("<i>SKU</i>", 1))
    assert post(client, "shop", body, standard_headers(body, msg_id=key)).status_code == 200

    # when
    page = admin_client.get(trace_url("shop", key)).content.decode()

    # then: shown as text, never as markup
    assert "<img src=x" not in page and "<i>SKU</i>" not in page and "<b>bold" not in page
    assert html.escape(key) in page or "&lt;img src=x" in page
    assert "&lt;i&gt;SKU&lt;/i&gt;" in page


@pytest.mark.django_db
def test_the_page_needs_the_view_permission_on_the_overview(story, client, staff_user):
    # given: a staff member with no permission at all
    user = staff_user()
    client.force_login(user)

    # when / then: refused
    assert client.get(trace_url("shop", APPLIED)).status_code == 403

    # and once they may view the overview, allowed
    staff_user.grant(user, "view_sourceoverview")
    user = User.objects.get(pk=user.pk)  # a fresh permission cache
    client.force_login(user)
    response = client.get(trace_url("shop", APPLIED))
    assert response.status_code == 200
    # without the view permission on audit records, no links to them
    assert "/admin/webhook_receiver/requestaudit/" not in response.content.decode()


@pytest.mark.django_db
def test_audit_records_and_receipts_link_to_their_trace(story, admin_client):
    link = html.escape(trace_url("shop", APPLIED))

    audit_list = admin_client.get(reverse("admin:webhook_receiver_requestaudit_changelist"))
    receipt_list = admin_client.get(reverse("admin:webhook_receiver_webhookreceipt_changelist"))
    receipt = event_trace(source="shop", event_key=APPLIED).receipt
    receipt_page = admin_client.get(
        reverse("admin:webhook_receiver_webhookreceipt_change", args=[receipt.id])
    )
    audit_id = event_trace(source="shop", event_key=APPLIED).deliveries[0].id
    audit_page = admin_client.get(
        reverse("admin:webhook_receiver_requestaudit_change", args=[audit_id])
    )

    for response in (audit_list, receipt_list, receipt_page, audit_page):
        assert response.status_code == 200
        assert link in response.content.decode()
    # two deliveries of the key: two rows with the link
    assert audit_list.content.decode().count(link) == 2
    # and the link leads to the trace
    assert admin_client.get(trace_url("shop", APPLIED)).status_code == 200


# --- manage.py webhook_trace -----------------------------------------------------------


@pytest.mark.django_db
def test_the_command_prints_the_story_one_line_per_delivery_and_attempt(story):
    # when
    out = StringIO()
    call_command("webhook_trace", DEAD, "--source", "shop", stdout=out, no_color=True)

    # then
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == f"shop · {DEAD} · {CRASH}"
    assert lines[1] == "1 delivery · no receipt · failed event dead after 2 attempts · " + (
        "1 repair item(s), 1 open"
    )
    attempts = [line for line in lines if "builtins.RuntimeError" in line]
    assert len(attempts) == 2
    assert attempts[0].split()[:1] == ["1"] and " delivery " in attempts[0]
    assert attempts[1].split()[:1] == ["2"] and " retry " in attempts[1]
    assert "Traceback" not in text
    assert "no outbox messages" in text
    deliveries = [line for line in lines if " deferred " in line]
    assert len(deliveries) == 1 and "202" in deliveries[0]


@pytest.mark.django_db
def test_the_command_aligns_its_columns(story):
    out = StringIO()
    call_command("webhook_trace", APPLIED, stdout=out, no_color=True)

    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.strip().startswith("received (UTC)"))
    rows = [line for line in lines if " verified " in line]
    assert len(rows) == 2
    # every row's verification column starts where its header does
    column = header.index("verification")
    assert all(row[column:].startswith("verified") for row in rows)
    assert any("SKU-RED" in line for line in lines)


@pytest.mark.django_db
def test_the_command_exits_1_when_nothing_holds_the_key():
    with pytest.raises(CommandError) as raised:
        call_command("webhook_trace", "msg_nobody", stdout=StringIO())

    assert raised.value.returncode == 1
    assert "Nothing in any source holds the event key 'msg_nobody'" in str(raised.value)


@pytest.mark.django_db
def test_the_command_names_the_sources_that_hold_a_key_missing_from_the_one_asked(story):
    with pytest.raises(CommandError) as raised:
        call_command("webhook_trace", APPLIED, "--source", "stripe", stdout=StringIO())

    assert raised.value.returncode == 1
    assert str(raised.value) == (
        f"Nothing in source 'stripe' holds the event key '{APPLIED}'. Sources that do: shop."
    )


# --- in a real browser -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_trace_page_in_a_browser(story, admin_browser, live_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    # when: the applied event's page
    admin_browser.get(live_server.url + trace_url("shop", APPLIED))

    # then: the story is visible
    text = admin_browser.find_element(By.ID, "content").text
    for visible in ("2 deliveries · receipt applied", "SKU-RED", "duplicate", "No outbox"):
        assert visible in text, visible
    screenshot(admin_browser, "trace")

    # and the dead event's page, its traceback folded until clicked
    admin_browser.get(live_server.url + trace_url("shop", DEAD))
    summary = admin_browser.find_element(By.CSS_SELECTOR, "details summary")
    traceback = admin_browser.find_element(By.CSS_SELECTOR, "details pre")
    assert not traceback.is_displayed()
    assert "handler crashed after its ledger write" in admin_browser.page_source
    screenshot(admin_browser, "trace-dead")
    summary.click()
    assert traceback.is_displayed()
    assert "Traceback" in traceback.text
    admin_browser.execute_script("arguments[0].scrollIntoView()", summary)
    screenshot(admin_browser, "trace-dead-traceback")
