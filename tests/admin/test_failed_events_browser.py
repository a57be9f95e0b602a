"""The failed-event list and detail page as a person uses them: in headless Chromium at
1400x1000, and through the test client for who sees which button.

The list fits the window (no sideways scrolling) and shows the last error's message;
the detail page's Replay and Discard buttons open the same confirmation pages as the
list's actions and change the event the same way.
"""

from __future__ import annotations

import html
import json

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from project.shop.models import InventoryLedgerEntry
from tests.support.admin import button_url, change_url
from tests.support.browser import click_through, no_sideways_scroll, screenshot
from tests.support.http import post
from tests.support.signing import event_body, standard_headers
from webhook_receiver.admin.cells import trace_url
from webhook_receiver.models import FailedEvent, FailureStatus

CHANGELIST = reverse("admin:webhook_receiver_failedevent_changelist")
TIMEOUT = "test.warehouse_timeout"
WAREHOUSE_MESSAGE = (
    "the warehouse did not answer within 5 s (POST https://warehouse.example/reservations, "
    "attempt 3 of 3, connection pool exhausted, 17 requests queued behind it)"
)
LONG_KEY = "msg_" + "2f9c41d7" * 8  # a 68-character message id, as some senders send


def warehouse_timeout(event):
    raise TimeoutError(WAREHOUSE_MESSAGE)


@pytest.fixture
def timeout(client, settings, failures) -> FailedEvent:
    """Beside the four-failure set (tests/conftest.py): a dead letter of a third kind, a
    timeout with a long message under a long key."""
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {
            **settings.WEBHOOK_RECEIVER["HANDLERS"],
            TIMEOUT: "tests.admin.test_failed_events_browser.warehouse_timeout",
        },
        "RETRY_MAX_ATTEMPTS": 1,
    }
    body = event_body(TIMEOUT, order_id="ord_T")
    assert post(client, "shop", body, standard_headers(body, msg_id=LONG_KEY)).status_code == 202
    return FailedEvent.objects.get(event_key=LONG_KEY)


# --- in a browser -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_list_fits_1400px_and_shows_the_last_errors_message(
    admin_browser,  # noqa: F811
    live_server,
    failures,
    timeout,
):
    from selenium.webdriver.common.by import By

    # when
    admin_browser.get(live_server.url + CHANGELIST)

    # then: every column fits the window
    no_sideways_scroll(admin_browser)
    headers = [
        th.text.strip().lower()
        for th in admin_browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")
    ]
    assert headers[1:] == ["event key", "event type", "status", "last error"]
    # the message after the class's name, shortened, the whole of it in the title
    cell = admin_browser.find_element(
        By.XPATH, f"//tr[.//a[contains(., '{LONG_KEY}')]]//td[contains(@class, 'field-last_error')]"
    )
    assert cell.text.startswith("TimeoutError: the warehouse did not answer within 5 s")
    assert cell.text.endswith("…") and len(cell.text) == 80
    shortened = cell.find_element(By.TAG_NAME, "span")
    assert shortened.get_attribute("title") == f"builtins.TimeoutError: {WAREHOUSE_MESSAGE}"
    # the long key wraps inside its column; under each key, its source and trace link
    assert admin_browser.find_element(By.PARTIAL_LINK_TEXT, LONG_KEY).is_displayed()
    traces = admin_browser.find_elements(By.LINK_TEXT, "trace")
    assert sorted(a.get_attribute("href") for a in traces) == sorted(
        live_server.url + trace_url(f.source, f.event_key) for f in [*failures.values(), timeout]
    )
    # under the status: the attempts, when the last failed, when a retrying one is next
    retrying = admin_browser.find_element(
        By.XPATH, "//tr[.//a[.='msg_retrying']]//td[contains(@class, 'field-state')]"
    )
    status, attempts, last, after = retrying.text.splitlines()
    assert (status, attempts) == ("Retrying", "1 attempt")
    assert last.startswith("last ") and after.startswith("next ")
    screenshot(admin_browser, "failed-events-list")


@pytest.mark.django_db(transaction=True)
def test_replay_from_the_detail_page(admin_browser, live_server, failures):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given: the crash's page
    failed = failures["crash"]
    admin_browser.get(live_server.url + change_url(failed))
    no_sideways_scroll(admin_browser, box=None)
    screenshot(admin_browser, "failed-event-detail")

    # when: Replay, then confirmed with a reason
    click_through(admin_browser, admin_browser.find_element(By.ID, "wr-replay"))
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Replay failed events"
    assert "msg_crash" in admin_browser.find_element(By.ID, "content").text
    admin_browser.find_element(By.NAME, "reason").send_keys("warehouse client fixed in 4.2.1")
    screenshot(admin_browser, "failed-event-replay-confirmation")
    click_through(
        admin_browser,
        admin_browser.find_element(By.CSS_SELECTOR, "input[type=submit][value='Replay 1 event']"),
    )

    # then: back on the event's page, with the result
    assert admin_browser.current_url.endswith(change_url(failed))
    notice = admin_browser.find_element(By.CSS_SELECTOR, "ul.messagelist li")
    assert notice.text == "Replayed 1 failed event: 1 applied."
    failed.refresh_from_db()
    assert (failed.status, failed.resolution) == (FailureStatus.RESOLVED, "applied")
    assert failed.last_replayed_by == "admin"
    assert InventoryLedgerEntry.objects.filter(event_key="msg_crash").count() == 1
    log = LogEntry.objects.get(object_id=str(failed.pk))
    assert log.change_message == "Replayed: applied. Reason: warehouse client fixed in 4.2.1"
    # and a resolved event offers neither button any more
    assert not admin_browser.find_elements(By.ID, "wr-replay")
    assert not admin_browser.find_elements(By.ID, "wr-discard")


@pytest.mark.django_db(transaction=True)
def test_discard_from_the_detail_page(admin_browser, live_server, failures):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given: the schema error's page
    failed = failures["schema"]
    admin_browser.get(live_server.url + change_url(failed))

    # when: Discard, confirmed first without a reason, then with one
    click_through(admin_browser, admin_browser.find_element(By.ID, "wr-discard"))
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Discard failed events"
    submit = "input[type=submit][value='Discard 1 event']"
    admin_browser.find_element(By.CSS_SELECTOR, submit).click()
    # the browser holds the form back: the reason is required
    reason = admin_browser.find_element(By.NAME, "reason")
    assert admin_browser.execute_script("return arguments[0].validity.valueMissing", reason)
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Discard failed events"
    assert FailedEvent.objects.get(pk=failed.pk).status == FailureStatus.DEAD
    reason.send_keys("test order, sent by mistake")
    click_through(admin_browser, admin_browser.find_element(By.CSS_SELECTOR, submit))

    # then
    assert admin_browser.current_url.endswith(change_url(failed))
    notice = admin_browser.find_element(By.CSS_SELECTOR, "ul.messagelist li")
    assert notice.text == "Discarded 1 failed event."
    failed.refresh_from_db()
    assert failed.status == FailureStatus.DISCARDED
    assert (failed.discarded_by, failed.discard_reason) == ("admin", "test order, sent by mistake")
    # a discarded event can still be replayed by hand, not discarded again
    assert admin_browser.find_elements(By.ID, "wr-replay")
    assert not admin_browser.find_elements(By.ID, "wr-discard")
    screenshot(admin_browser, "failed-event-discarded")


# --- who sees which button (the test client) -------------------------------------------------


def buttons(response) -> set[str]:
    content = response.content.decode()
    return {name for name in ("wr-replay", "wr-discard") if f'id="{name}"' in content}


@pytest.mark.django_db
def test_superuser_gets_both_buttons_where_they_apply(admin_client, failures):
    assert buttons(admin_client.get(change_url(failures["schema"]))) == {"wr-replay", "wr-discard"}
    assert buttons(admin_client.get(change_url(failures["retrying"]))) == {
        "wr-replay",
        "wr-discard",
    }
    FailedEvent.objects.filter(pk=failures["crash"].pk).update(status=FailureStatus.RESOLVED)
    assert buttons(admin_client.get(change_url(failures["crash"]))) == set()


@pytest.mark.django_db
def test_view_permission_alone_shows_no_button_and_the_urls_refuse(client, staff_user, failures):
    # given
    client.force_login(staff_user("view_failedevent"))
    failed = failures["schema"]

    # when / then
    assert buttons(client.get(change_url(failed))) == set()
    assert client.get(button_url(failed, "replay")).status_code == 403
    assert client.post(button_url(failed, "replay"), {"post": "yes"}).status_code == 403
    refused = client.post(button_url(failed, "discard"), {"post": "yes", "reason": "x"})
    assert refused.status_code == 403
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (FailureStatus.DEAD, 1)


@pytest.mark.django_db
def test_each_permission_shows_its_own_button(client, staff_user, failures):
    user = staff_user("view_failedevent", "replay_failedevent")
    client.force_login(user)
    assert buttons(client.get(change_url(failures["schema"]))) == {"wr-replay"}
    assert client.get(button_url(failures["schema"], "discard")).status_code == 403

    user.user_permissions.clear()
    staff_user.grant(user, "view_failedevent", "discard_failedevent")
    assert buttons(client.get(change_url(failures["schema"]))) == {"wr-discard"}
    assert client.get(button_url(failures["schema"], "replay")).status_code == 403


@pytest.mark.django_db
def test_the_buttons_use_the_actions_confirmation_pages(admin_client, timeout):
    failed = timeout

    # the replay page: the shared confirmation frame, listing the one event
    replay = admin_client.get(button_url(failed, "replay"))
    assert replay.status_code == 200
    assert replay.template_name == "admin/webhook_receiver/action_confirmation.html"
    content = replay.content.decode()
    assert html.escape("Replaying runs each event's stored, verified bytes") in content
    assert html.escape(LONG_KEY) in content
    assert '<textarea name="reason"' in content

    # the discard page: the list action's own page and form
    discard = admin_client.get(button_url(failed, "discard"))
    assert discard.template_name == "admin/webhook_receiver/action_confirmation.html"
    assert "Discarding gives up on an event" in discard.content.decode()
    assert discard.context["form"].fields["reason"].required


@pytest.mark.django_db
def test_a_replay_without_a_reason_is_fine_and_one_that_fails_says_so(admin_client, failures):
    # when: the schema error is replayed (it fails again: permanent)
    failed = failures["schema"]
    response = admin_client.post(button_url(failed, "replay"), {"post": "yes", "reason": ""})

    # then
    assert response.status_code == 302
    assert response["Location"] == change_url(failed)
    [message] = get_messages(response.wsgi_request)
    assert message.level == messages.ERROR
    assert message.message.startswith("Replayed 1 failed event: 1 failed. Failed: shop:msg_schema")
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (FailureStatus.DEAD, 2)
    assert LogEntry.objects.get(object_id=str(failed.pk)).change_message == "Replayed: failed"


@pytest.mark.django_db
def test_a_button_url_for_a_status_it_does_not_apply_to_changes_nothing(admin_client, failures):
    # given: a resolved event
    failed = failures["crash"]
    FailedEvent.objects.filter(pk=failed.pk).update(status=FailureStatus.RESOLVED)

    # when
    response = admin_client.post(button_url(failed, "discard"), {"post": "yes", "reason": "x"})

    # then
    assert response.status_code == 302
    assert response["Location"] == change_url(failed)
    [message] = get_messages(response.wsgi_request)
    assert message.message == "A resolved event cannot be discarded."
    failed.refresh_from_db()
    assert failed.status == FailureStatus.RESOLVED
    assert admin_client.get(button_url(failed, "replay")).status_code == 302
    assert (
        admin_client.get(
            reverse("admin:webhook_receiver_failedevent_replay", args=[999999])
        ).status_code
        == 404
    )


@pytest.mark.django_db
def test_the_replay_button_applies_a_crash_once_its_handler_is_fixed(admin_client, failures):
    # given: the crash's dead letter, its handler working again (the fix is deployed)
    failed = failures["crash"]
    assert not InventoryLedgerEntry.objects.filter(event_key="msg_crash").exists()

    # when: its page's Replay, confirmed
    response = admin_client.post(
        button_url(failed, "replay"), {"post": "yes", "reason": "warehouse client fixed"}
    )

    # then: applied once, back on its page, which offers no button any more
    assert response.status_code == 302
    assert response["Location"] == change_url(failed)
    [message] = get_messages(response.wsgi_request)
    assert (message.level, message.message) == (
        messages.SUCCESS,
        "Replayed 1 failed event: 1 applied.",
    )
    failed.refresh_from_db()
    assert (failed.status, failed.resolution, failed.last_replayed_by) == (
        FailureStatus.RESOLVED,
        "applied",
        "admin",
    )
    assert InventoryLedgerEntry.objects.filter(event_key="msg_crash").count() == 1
    log = LogEntry.objects.get(object_id=str(failed.pk))
    assert log.change_message == "Replayed: applied. Reason: warehouse client fixed"
    assert buttons(admin_client.get(change_url(failed))) == set()


@pytest.mark.django_db(transaction=True)
def test_an_invalid_payload_lists_its_fields_on_the_detail_and_trace_pages(
    admin_browser,  # noqa: F811
    live_server,
    client,
):
    from selenium.webdriver.common.by import By

    # given: a reservation that the shop's serializer refuses on three fields
    lines = [{"sku": "SKU-1", "quantity": 1}, {"sku": "", "quantity": 0}]
    body = json.dumps({"type": "inventory.reserved", "data": {"order_id": "ord_F", "lines": lines}})
    answer = post(client, "shop", body.encode(), standard_headers(body.encode(), msg_id="msg_F"))
    assert answer.json()["status"] == "dead_lettered"
    failed = FailedEvent.objects.get(event_key="msg_F")
    expected = [
        "version: This field is required.",
        "lines[1].sku: This field may not be blank.",
        "lines[1].quantity: Ensure this value is greater than or equal to 1.",
    ]

    # when: the failed event's page, then its trace
    admin_browser.get(live_server.url + change_url(failed))
    shown = [
        li.text for li in admin_browser.find_elements(By.CSS_SELECTOR, ".field-error_history li")
    ]
    history = admin_browser.find_element(By.CSS_SELECTOR, ".field-error_history")
    admin_browser.execute_script("arguments[0].scrollIntoView()", history)
    screenshot(admin_browser, "failed-event-field-errors")
    admin_browser.get(live_server.url + trace_url("shop", "msg_F"))
    traced = [li.text for li in admin_browser.find_elements(By.CSS_SELECTOR, "ul.fields li")]
    screenshot(admin_browser, "trace-field-errors")

    # then: one field a line, in DRF's words, on both
    assert shown == expected
    assert traced == expected
