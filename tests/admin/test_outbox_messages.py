"""The outbox messages' admin: the list with its filters and search, a message's page
with its attempts, Retry now and Discard with their permissions, and the pages as a
person sees them in headless Chromium at 1400x1000.

The attempt histories are made the way production makes them: the real relay sends to a
real HTTP receiver on loopback (or to a closed port) and records what it is answered.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.contrib.admin.sites import site
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from tests.support.admin import act, action_values, button_url, change_url, flash
from tests.support.browser import click_through, no_sideways_scroll, screenshot
from tests.support.outbox import CLOSED_PORT, destination, message
from webhook_receiver.models import MessageStatus, OutboxMessage, WebhookDestination
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record, relay_send

pytestmark = pytest.mark.django_db

MESSAGES = reverse("admin:webhook_receiver_outboxmessage_changelist")


def relay_round(dest: WebhookDestination, now) -> None:
    """One round of the real relay: claim, send over HTTP, record."""
    dest.refresh_from_db()
    claimed = relay_claim(destination=dest, now=now).claimed
    relay_record(dest, relay_send(dest, claimed), now=now)


@pytest.fixture
def history(receiver):
    """Messages the real relay has sent to a real receiver and to a closed port:

    - refused: answered 404, failed at once (terminal);
    - flaky: answered 503, then 500, failed once its two attempts were spent;
    - paced: answered 429 with Retry-After: 240, pending for four minutes;
    - paid: answered 200, delivered;
    - unreachable: sent to a port where nothing listens, failed after its one attempt.
    """
    merchant = destination("merchant-7", receiver.url, max_attempts=2)
    warehouse = destination("warehouse", CLOSED_PORT, max_attempts=1)
    made = {
        "refused": message(
            merchant,
            "order:ord_1:paid:v1",
            ordering_key="order:ord_1",
            origin_source="shop",
            origin_event_key="msg_paid_1",
        ),
        "flaky": message(merchant, "order:ord_2:paid:v1", ordering_key="order:ord_2"),
        "paced": message(merchant, "order:ord_3:paid:v1", event_type="order.cancelled"),
        "paid": message(merchant, "order:ord_4:paid:v1"),
        "unreachable": message(warehouse, "order:ord_5:paid:v1"),
    }
    receiver.answer(404, key="order:ord_1:paid:v1")
    receiver.answer(503, key="order:ord_2:paid:v1")
    receiver.answer(500, key="order:ord_2:paid:v1")
    receiver.answer(429, {"retry-after": "240"}, key="order:ord_3:paid:v1")
    start = timezone.now()
    relay_round(merchant, start)
    relay_round(warehouse, start)
    # the flaky one's backoff (at most 2 s) has passed: its second and last attempt
    relay_round(merchant, start + timedelta(seconds=5))
    for row in made.values():
        row.refresh_from_db()
    return made


def keys(response) -> set[str]:
    assert response.status_code == 200
    return {m.key for m in response.context["cl"].result_list}


# --- the messages' list ------------------------------------------------------------------


def test_the_message_list_shows_each_message_with_its_last_answer(admin_client, history):
    response = admin_client.get(MESSAGES)

    assert keys(response) == {m.key for m in history.values()}
    content = response.content.decode()
    for text in ("merchant-7", "warehouse", "HTTP 404", "HTTP 500", "ConnectError", "Delivered"):
        assert text in content
    assert "2 attempts" in content  # under the flaky one's status
    # the trace link of the message an inbound event enqueued
    assert "/trace/?source=shop&amp;key=msg_paid_1" in content


FILTERS = [
    ({"status__exact": "failed"}, {"refused", "flaky", "unreachable"}),
    ({"status__exact": "pending"}, {"paced"}),
    ({"event_type": "order.cancelled"}, {"paced"}),
]


@pytest.mark.parametrize(("query", "expected"), FILTERS)
def test_the_message_list_filters(admin_client, history, query, expected):
    response = admin_client.get(MESSAGES, query)

    assert keys(response) == {history[name].key for name in expected}


def test_the_message_list_filters_by_destination(admin_client, history):
    warehouse = WebhookDestination.objects.get(name="warehouse")

    response = admin_client.get(MESSAGES, {"destination__id__exact": warehouse.pk})

    assert keys(response) == {history["unreachable"].key}


def test_search_finds_an_exact_key_or_ordering_key_and_nothing_partial(admin_client, history):
    assert keys(admin_client.get(MESSAGES, {"q": "order:ord_2:paid:v1"})) == {history["flaky"].key}
    assert keys(admin_client.get(MESSAGES, {"q": "order:ord_1"})) == {history["refused"].key}
    assert keys(admin_client.get(MESSAGES, {"q": "order:ord"})) == set()


@pytest.mark.postgres_only("the plan checked is PostgreSQL's planner's")
def test_the_search_looks_keys_up_in_the_indexes(rf, admin_user):
    # given: 40,000 delivered messages over four destinations, and fresh statistics
    ids = [destination(f"d{n}").pk for n in range(4)]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_receiver_outboxmessage
                (destination_id, key, event_type, payload, metadata, ordering_key, status,
                 attempts, failures, next_attempt_at, origin_source, origin_event_key,
                 created_at, last_error, discarded_by, discard_reason)
            SELECT %s[1 + g %% 4], 'order:' || g || ':paid:v1', 'order.paid', '{}', '{}',
                   'order:' || (g / 3), 'delivered', 1, 0, now(), '', '', now(), '', '', ''
            FROM generate_series(1, 40000) g
            """,
            [ids],
        )
        cursor.execute("ANALYZE webhook_receiver_outboxmessage")
    model_admin = site.get_model_admin(OutboxMessage)
    request = rf.get("/", {"q": "order:777:paid:v1"})
    request.user = admin_user

    # when
    found, _ = model_admin.get_search_results(
        request, OutboxMessage.objects.all(), "order:777:paid:v1"
    )
    plan = found.order_by().explain()

    # then: both indexes lead with the destination; naming every destination makes
    # each key an index lookup (PostgreSQL 15 has no skip scan), not a read of the table
    assert [m.key for m in found] == ["order:777:paid:v1"]
    assert "Seq Scan" not in plan, plan
    assert "Index Scan on webhook_outbox_key" in plan, plan
    assert "Index Scan on webhook_outbox_ordering" in plan, plan


# --- the message's page ------------------------------------------------------------------


def test_the_message_page_shows_payload_attempts_and_origin(admin_client, history):
    # given: the flaky one, with two attempts
    row = history["refused"]

    # when
    response = admin_client.get(change_url(row))

    # then
    assert response.status_code == 200
    content = response.content.decode()
    assert "&quot;data&quot;: {\n" in content  # the payload, indented
    assert 'class="wr-attempts"' in content and "<td>HTTP 404</td>" in content
    assert "no such hook" not in content  # the receiver answers {"ok": true}
    assert "{&quot;ok&quot;: true}" in content  # the response's excerpt
    assert "shop event msg_paid_1" in content and "/trace/?source=shop" in content
    # the buttons of a failed message, for a user with both permissions
    for button in ("wr-retry", "wr-discard", "wr-trace"):
        assert f'id="{button}"' in content


def test_the_message_page_shows_its_metadata_indented_and_escaped(admin_client):
    # given: a message a model wrote, whose metadata holds markup
    metadata = {"prompt_version": "<script>alert(1)</script>", "tokens": 812}
    row = message(destination("merchant-7"), "summary:ord_1:v1", metadata=metadata)

    # when
    response = admin_client.get(change_url(row))

    # then: read-only, indented, as text
    assert response.status_code == 200
    content = response.content.decode()
    assert "<script>alert" not in content
    assert "&quot;prompt_version&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;,\n" in (
        content
    )
    assert "&quot;tokens&quot;: 812\n" in content
    assert 'name="metadata"' not in content  # no input: read-only


def test_a_message_without_metadata_shows_a_dash(admin_client):
    row = message(destination("merchant-7"), "order:ord_1:paid:v1")

    content = admin_client.get(change_url(row)).content.decode()

    field = content[content.index("field-pretty_metadata") :]
    assert field[: field.index("</div>") + 6].endswith('<div class="readonly">-</div>')


def test_the_attempt_table_lists_every_attempt_in_order(admin_client, history):
    response = admin_client.get(change_url(history["flaky"]))

    content = response.content.decode()
    first, second = content.index("<td>HTTP 503</td>"), content.index("<td>HTTP 500</td>")
    assert first < second


def test_a_view_only_user_sees_no_button_and_no_action(client, staff_user, history):
    # given
    client.force_login(staff_user("view_outboxmessage"))
    row = history["refused"]

    # when / then: the list offers no action, the page no button
    assert action_values(client.get(MESSAGES)) == set()
    content = client.get(change_url(row)).content.decode()
    assert 'id="wr-retry"' not in content and 'id="wr-discard"' not in content
    # and the buttons' own URLs refuse
    assert client.get(button_url(row, "retry")).status_code == 403
    assert (
        client.post(button_url(row, "discard"), {"post": "yes", "reason": "x"}).status_code == 403
    )


# --- Retry now ---------------------------------------------------------------------------


def test_retry_now_without_its_permission_changes_nothing(client, staff_user, history):
    client.force_login(staff_user("view_outboxmessage", "discard_outboxmessage"))
    row = history["refused"]

    assert action_values(client.get(MESSAGES)) == {"", "discard_selected"}
    response = act(client, MESSAGES, "retry_now_selected", row, reason="")

    # the action is not one of the form's choices: nothing ran
    assert response.status_code in (200, 302)
    row.refresh_from_db()
    assert row.status == MessageStatus.FAILED


def test_retry_now_asks_first_then_requeues_and_records_who(client, staff_user, history):
    # given
    user = staff_user("view_outboxmessage", "retry_outboxmessage")
    client.force_login(user)
    rows = history["refused"], history["flaky"], history["paid"]

    # when: the action, from the list
    page = act(client, MESSAGES, "retry_now_selected", *rows)

    # then: a confirmation page, the selection on it, nothing changed yet
    assert page.status_code == 200
    assert "admin/webhook_receiver/action_confirmation.html" in [t.name for t in page.templates]
    content = page.content.decode()
    assert "order:ord_1:paid:v1" in content and "(left as it is)" in content
    assert 'value="Retry 3 messages now"' in content
    assert OutboxMessage.objects.get(pk=rows[0].pk).status == MessageStatus.FAILED

    # when: confirmed, with a reason
    before = timezone.now()
    response = act(client, MESSAGES, "retry_now_selected", *rows, reason="merchant fixed the route")

    # then: the two failed ones are due now with a fresh budget; the delivered one as was
    assert response.status_code == 302
    for row in rows[:2]:
        row.refresh_from_db()
        assert (row.status, row.failures, row.lease_until) == (MessageStatus.PENDING, 0, None)
        assert before <= row.next_attempt_at <= timezone.now()
    assert OutboxMessage.objects.get(pk=rows[2].pk).status == MessageStatus.DELIVERED
    assert flash(response) == [
        (
            messages.WARNING,
            "Queued 2 messages to send now. 1 was left as it was (its status does not allow it).",
        ),
    ]
    # who, when and why, in each message's history
    logs = LogEntry.objects.filter(user=user).order_by("object_id")
    assert {log.object_id for log in logs} == {str(rows[0].pk), str(rows[1].pk)}
    assert {log.change_message for log in logs} == {"Retried now. Reason: merchant fixed the route"}
    assert all(before <= log.action_time <= timezone.now() for log in logs)


def test_retry_now_says_when_an_open_breaker_holds_the_messages_back(admin_client, history):
    # given: the merchant's breaker is open for ten more minutes
    until = timezone.now() + timedelta(minutes=10)
    WebhookDestination.objects.filter(name="merchant-7").update(
        consecutive_failures=10, paused_until=until
    )

    # when
    response = act(admin_client, MESSAGES, "retry_now_selected", history["refused"], reason="")

    # then
    notices = [text for level, text in flash(response) if level == messages.WARNING]
    assert len(notices) == 1 and notices[0].startswith("merchant-7's breaker is open until")


def test_retry_now_from_the_message_page(admin_client, history):
    row = history["unreachable"]

    page = admin_client.get(button_url(row, "retry"))
    assert page.status_code == 200 and 'value="Retry 1 message now"' in page.content.decode()
    response = admin_client.post(button_url(row, "retry"), {"post": "yes", "reason": ""})

    assert response.status_code == 302 and response.url == change_url(row)
    row.refresh_from_db()
    assert row.status == MessageStatus.PENDING


def test_a_button_for_a_status_it_does_not_apply_to_goes_back_with_a_warning(admin_client, history):
    row = history["paid"]

    response = admin_client.get(button_url(row, "discard"))

    assert response.status_code == 302 and response.url == change_url(row)
    assert flash(response) == [(messages.WARNING, "A delivered message cannot be discarded.")]
    assert 'id="wr-retry"' not in admin_client.get(change_url(row)).content.decode()


# --- Discard -------------------------------------------------------------------------------


def test_discard_without_its_permission_is_not_offered(client, staff_user, history):
    client.force_login(staff_user("view_outboxmessage", "retry_outboxmessage"))
    row = history["refused"]

    assert action_values(client.get(MESSAGES)) == {"", "retry_now_selected"}
    act(client, MESSAGES, "discard_selected", row, reason="not wanted")
    assert client.get(button_url(row, "discard")).status_code == 403

    row.refresh_from_db()
    assert (row.status, row.discarded_by) == (MessageStatus.FAILED, "")


def test_discard_asks_for_a_reason_and_keeps_who_and_why(client, staff_user, history):
    # given
    user = staff_user("view_outboxmessage", "discard_outboxmessage")
    client.force_login(user)
    rows = history["refused"], history["paced"]

    # when: the first post shows the confirmation page
    page = act(client, MESSAGES, "discard_selected", *rows)
    assert page.status_code == 200
    assert 'value="Discard 2 messages"' in page.content.decode()

    # when: confirmed without a reason
    refused = act(client, MESSAGES, "discard_selected", *rows, reason="   ")

    # then: the page again, with the error; nothing discarded
    assert refused.status_code == 200
    assert refused.context["form"].errors == {"reason": ["This field is required."]}
    assert not OutboxMessage.objects.filter(status=MessageStatus.DISCARDED).exists()

    # when: with a reason
    before = timezone.now()
    response = act(
        client, MESSAGES, "discard_selected", *rows, reason="order ord_1 was a test order"
    )

    # then
    assert response.status_code == 302
    assert flash(response) == [(messages.SUCCESS, "Discarded 2 messages.")]
    for row in rows:
        row.refresh_from_db()
        assert (row.status, row.discarded_by, row.discard_reason) == (
            MessageStatus.DISCARDED,
            "operator",
            "order ord_1 was a test order",
        )
        assert before <= row.next_attempt_at <= timezone.now()  # when it was discarded
    log = LogEntry.objects.filter(user=user, object_id=str(rows[0].pk)).get()
    assert log.change_message == "Discarded: order ord_1 was a test order"
    # the page now shows who and why, and no button
    content = client.get(change_url(rows[0])).content.decode()
    assert "order ord_1 was a test order" in content and 'id="wr-discard"' not in content


# --- in a browser --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_message_list_fits_1400px(admin_browser, live_server, history):
    from selenium.webdriver.common.by import By

    # given: a long key, as some hosts make them
    merchant = WebhookDestination.objects.get(name="merchant-7")
    long_key = "order:ord_" + "7c1f9e2a" * 6 + ":fulfilment.partially_shipped:v12"
    message(
        merchant,
        long_key,
        MessageStatus.FAILED,
        event_type="order.fulfilment.partially_shipped",
        ordering_key="order:ord_" + "7c1f9e2a" * 6,
        attempts=12,
        failures=12,
        last_status_code=502,
        last_error="<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
    )

    # when
    admin_browser.get(live_server.url + MESSAGES)

    # then
    no_sideways_scroll(admin_browser)
    headers = [
        th.text.strip().lower()
        for th in admin_browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")
    ]
    assert headers[1:] == ["key", "destination", "event type", "status", "last answer", "created"]
    flaky = admin_browser.find_element(
        By.XPATH, "//tr[.//a[contains(., 'ord_2')]]//td[contains(@class, 'field-state')]"
    )
    assert flaky.text.splitlines() == ["Failed", "2 attempts"]
    paced = admin_browser.find_element(
        By.XPATH, "//tr[.//a[contains(., 'ord_3')]]//td[contains(@class, 'field-state')]"
    )
    status, attempts, after = paced.text.splitlines()
    assert (status, attempts) == ("Pending", "1 attempt") and after.startswith("next ")
    screenshot(admin_browser, "outbox-messages")


@pytest.mark.django_db(transaction=True)
def test_the_message_page_shows_the_attempts_and_retries_now(admin_browser, live_server, history):
    from selenium.webdriver.common.by import By

    # given: the flaky message's page
    row = history["flaky"]
    admin_browser.get(live_server.url + change_url(row))

    # then: its two attempts, in a table
    no_sideways_scroll(admin_browser, box=None)
    table = admin_browser.find_element(By.CSS_SELECTOR, "table.wr-attempts")
    cells = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert [(c[0], c[3], c[4]) for c in cells] == [
        ("1", "HTTP 503", '{"ok": true}'),
        ("2", "HTTP 500", '{"ok": true}'),
    ]
    assert cells[0][5] != "-" and cells[1][5] == "-"  # the first was deferred; the last failed
    screenshot(admin_browser, "outbox-message-detail")
    admin_browser.execute_script("arguments[0].scrollIntoView()", table)
    screenshot(admin_browser, "outbox-message-attempts")

    # when: Retry now, confirmed
    click_through(admin_browser, admin_browser.find_element(By.ID, "wr-retry"))
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Retry outbox messages now"
    admin_browser.find_element(By.NAME, "reason").send_keys("merchant deployed a fix")
    screenshot(admin_browser, "outbox-retry-confirmation")
    click_through(
        admin_browser,
        admin_browser.find_element(
            By.CSS_SELECTOR, "input[type=submit][value='Retry 1 message now']"
        ),
    )

    # then: back on its page, pending again and due now (the service's commit wakes the
    # relays: tests/outbound/test_operations.py)
    assert admin_browser.current_url.endswith(change_url(row))
    notice = admin_browser.find_element(By.CSS_SELECTOR, "ul.messagelist li")
    assert notice.text == "Queued 1 message to send now."
    row.refresh_from_db()
    assert (row.status, row.failures) == (MessageStatus.PENDING, 0)
    assert row.next_attempt_at <= timezone.now()
