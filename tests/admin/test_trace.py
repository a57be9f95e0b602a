"""The admin's trace page: the whole story of a key in order, its effects, the lookup
form, escaping, its permission, the links to it from the lists, and the page in a real
browser. The story is tests/support/trace.py's, with the demo's trace hook on."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.support.browser import screenshot
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from tests.support.trace import APPLIED, DEAD, FULFILLED, ORDER, PAID
from webhook_receiver.admin.cells import trace_url
from webhook_receiver.models import FailedEvent, RepairItem, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.watch.trace import event_trace

pytestmark = pytest.mark.usefixtures("shop_effects")


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
def test_the_admin_page_shows_each_message_s_metadata_under_it_escaped(summarised, admin_client):
    # given: one more message of the event, whose metadata holds markup
    merchant = WebhookDestination.objects.get(name="merchant")
    note = {"note": "<script>alert(1)</script>"}
    enqueue_webhook(merchant, "order.note", "note:1", {}, origin=("shop", PAID), metadata=note)

    # when
    page = admin_client.get(trace_url("shop", PAID)).content.decode()

    # then: as compact JSON, as text, under its message; none for the message with none
    quoted = html.escape('metadata: {"prompt_version":"v3","tokens":812}')
    assert quoted in page
    assert page.index(f"summary:{ORDER}:v2") < page.index(quoted)
    assert html.escape('metadata: {"note":"<script>alert(1)</script>"}') in page
    assert "<script>alert" not in page
    assert page.count('<tr class="metadata">') == 2


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


@pytest.mark.django_db(transaction=True)
def test_a_message_the_filter_left_out_on_the_trace_page(filtered, admin_browser, live_server):
    from selenium.webdriver.common.by import By

    # when
    admin_browser.get(live_server.url + trace_url("shop", PAID))

    # then: the message's row says the filter discarded it, and why
    row = admin_browser.find_element(By.XPATH, "//tr[td[contains(., 'discarded by filter')]]")
    assert "metadata.channel is 'pos', not 'web'" in row.text
    admin_browser.execute_script("arguments[0].scrollIntoView()", row)
    screenshot(admin_browser, "trace-filtered")
