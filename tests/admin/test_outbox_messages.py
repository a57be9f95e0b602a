"""The outbox's operating surface: the services the admin calls (retry now, discard,
recover since), the messages' admin with its two actions and their permissions, the
destinations' admin with its health figures, secrets and Recover since…, and the pages
as a person sees them in headless Chromium at 1400x1000.

The attempt histories are made the way production makes them: the real relay sends to a
real HTTP receiver on loopback (or to a closed port) and records what it is answered.
The health figures are checked against rows written with known values.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.contrib.admin.sites import site
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import screenshot
from webhook_receiver.admin.forms import secret_label
from webhook_receiver.models import (
    DeliveryAttempt,
    MessageStatus,
    OutboxMessage,
    WebhookDestination,
)
from webhook_receiver.outbound.breaker import destination_breaker
from webhook_receiver.outbound.operations import (
    destination_recover_since,
    message_discard,
    message_retry_now,
)
from webhook_receiver.outbound.relay.claim import relay_claim
from webhook_receiver.outbound.relay.record import relay_record
from webhook_receiver.outbound.relay.transport import relay_send

pytestmark = pytest.mark.django_db

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OLD_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
NEW_SECRET = "whsec_dGhlIG5ldyBzZWNyZXQgb2YgdGhlIHJvdGF0aW9u"
MESSAGES = reverse("admin:webhook_receiver_outboxmessage_changelist")
DESTINATIONS = reverse("admin:webhook_receiver_webhookdestination_changelist")
CLOSED_PORT = "http://127.0.0.1:9/hooks"  # the discard port: nothing listens


# --- making records ----------------------------------------------------------------------


def destination(name: str, url: str = CLOSED_PORT, **fields) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name=name,
        url=url,
        secrets=fields.pop("secrets", [SECRET, OLD_SECRET]),
        event_types=["order.paid", "order.cancelled"],
        **fields,
    )


def message(dest, key, status=MessageStatus.PENDING, **fields) -> OutboxMessage:
    now = timezone.now()
    return OutboxMessage.objects.create(
        destination=dest,
        key=key,
        event_type=fields.pop("event_type", "order.paid"),
        payload=fields.pop("payload", {"type": "order.paid", "data": {"key": key}}),
        status=status,
        next_attempt_at=fields.pop("next_attempt_at", now),
        created_at=fields.pop("created_at", now),
        **fields,
    )


def failed(dest, key, *, last_attempt_at, **fields) -> OutboxMessage:
    """A terminal message whose last attempt started at ``last_attempt_at``."""
    row = message(
        dest,
        key,
        MessageStatus.FAILED,
        attempts=1,
        failures=1,
        last_status_code=404,
        last_error='{"error": "no such hook"}',
        next_attempt_at=last_attempt_at,
        **fields,
    )
    DeliveryAttempt.objects.create(
        message=row, number=1, started_at=last_attempt_at, duration_ms=12, status_code=404
    )
    return row


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


def test_the_fixture_made_the_expected_records(history):
    assert {name: m.status for name, m in history.items()} == {
        "refused": MessageStatus.FAILED,
        "flaky": MessageStatus.FAILED,
        "paced": MessageStatus.PENDING,
        "paid": MessageStatus.DELIVERED,
        "unreachable": MessageStatus.FAILED,
    }
    assert (history["flaky"].attempts, history["flaky"].last_status_code) == (2, 500)
    assert history["unreachable"].last_error.startswith("ConnectError")
    assert history["paced"].next_attempt_at > timezone.now() + timedelta(seconds=200)


# --- helpers for the admin -----------------------------------------------------------------


def action_values(response) -> set[str]:
    form = response.context["action_form"]
    return set() if form is None else {value for value, _ in form.fields["action"].choices}


def keys(response) -> set[str]:
    assert response.status_code == 200
    return {m.key for m in response.context["cl"].result_list}


def flash(response) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def act(client, action: str, *rows, url: str = MESSAGES, **confirmation):
    """The action's first post (from the list), or with ``confirmation`` the
    confirmation page's post."""
    client.cookies.pop("messages", None)  # each post's messages are its own
    data = {"action": action, "_selected_action": [r.pk for r in rows]}
    if confirmation:
        data |= {"post": "yes", **confirmation}
    else:
        data["index"] = 0
    return client.post(url, data)


def change_url(row) -> str:
    model = type(row)._meta.model_name
    return reverse(f"admin:webhook_receiver_{model}_change", args=[row.pk])


def button_url(row, name: str) -> str:
    model = type(row)._meta.model_name
    return reverse(f"admin:webhook_receiver_{model}_{name}", args=[row.pk])


# --- the services --------------------------------------------------------------------------


def test_retry_now_makes_failed_and_pending_messages_due_with_a_fresh_budget(
    django_capture_on_commit_callbacks,
):
    # given: one message in each status, two destinations
    merchant, warehouse = destination("merchant-7"), destination("warehouse")
    later = timezone.now() + timedelta(hours=1)
    rows = {
        "failed": failed(merchant, "k-failed", last_attempt_at=timezone.now()),
        "pending": message(warehouse, "k-pending", attempts=3, failures=3, next_attempt_at=later),
        "delivered": message(merchant, "k-delivered", MessageStatus.DELIVERED, attempts=1),
        "discarded": message(merchant, "k-discarded", MessageStatus.DISCARDED),
        "sending": message(merchant, "k-sending", MessageStatus.SENDING, lease_until=later),
    }
    now = timezone.now()

    # when
    with django_capture_on_commit_callbacks() as callbacks:
        changed = message_retry_now(message_ids=[r.pk for r in rows.values()], by="alice", now=now)

    # then: failed and pending are due now, with no lease and no failures spent
    assert changed == sorted([rows["failed"].pk, rows["pending"].pk])
    for name in ("failed", "pending"):
        row = OutboxMessage.objects.get(pk=rows[name].pk)
        assert (row.status, row.next_attempt_at, row.lease_until, row.failures) == (
            MessageStatus.PENDING,
            now,
            None,
            0,
        )
        assert row.attempts == rows[name].attempts  # the history goes on from where it was
    # the others are as they were
    for name in ("delivered", "discarded", "sending"):
        assert OutboxMessage.objects.get(pk=rows[name].pk).status == rows[name].status
    # one relay run queued per destination touched
    assert len(callbacks) == 2


def test_retry_now_queues_a_relay_run_on_the_real_broker(
    broker, django_capture_on_commit_callbacks
):
    # given
    merchant = destination("merchant-7")
    row = failed(merchant, "k-failed", last_attempt_at=timezone.now())

    # when: the transaction commits (its on-commit work runs)
    with django_capture_on_commit_callbacks(execute=True):
        message_retry_now(message_ids=[row.pk], by="alice")

    # then: Celery's message is in Redis, for this destination's relay
    assert broker.llen("celery") == 1
    queued = json.loads(broker.lindex("celery", 0))
    assert queued["headers"]["task"] == "webhook_receiver.relay_destination"
    args, kwargs, _ = json.loads(base64.b64decode(queued["body"]))
    assert (args, kwargs) == ([merchant.pk], {})


def test_nothing_to_retry_queues_nothing(django_capture_on_commit_callbacks):
    merchant = destination("merchant-7")
    row = message(merchant, "k-delivered", MessageStatus.DELIVERED)

    with django_capture_on_commit_callbacks() as callbacks:
        changed = message_retry_now(message_ids=[row.pk], by="alice")

    assert changed == [] and callbacks == []


def test_discard_needs_a_reason_and_records_who_why_and_when(django_capture_on_commit_callbacks):
    # given
    merchant = destination("merchant-7")
    rows = [
        failed(merchant, "k-failed", last_attempt_at=timezone.now() - timedelta(hours=2)),
        message(merchant, "k-pending"),
        message(merchant, "k-delivered", MessageStatus.DELIVERED),
    ]
    ids = [r.pk for r in rows]

    # a blank reason is refused, and changes nothing
    with pytest.raises(ValueError, match="needs a reason"):
        message_discard(message_ids=ids, by="alice", reason="  \n")
    assert OutboxMessage.objects.filter(status=MessageStatus.DISCARDED).count() == 0

    # when
    now = timezone.now()
    with django_capture_on_commit_callbacks() as callbacks:
        changed = message_discard(message_ids=ids, by="alice", reason=" order cancelled ", now=now)

    # then: the failed and the pending one; the delivered one stays delivered
    assert changed == ids[:2]
    for row in OutboxMessage.objects.filter(pk__in=ids[:2]):
        assert (row.status, row.discarded_by, row.discard_reason, row.next_attempt_at) == (
            MessageStatus.DISCARDED,
            "alice",
            "order cancelled",
            now,
        )
    assert OutboxMessage.objects.get(pk=ids[2]).status == MessageStatus.DELIVERED
    # the messages queued behind a discarded one may go now: a relay run
    assert len(callbacks) == 1


def test_recover_since_requeues_only_this_destinations_failures_since_then(
    django_capture_on_commit_callbacks,
):
    # given: the merchant's endpoint broke at 02:00 and was fixed at 03:00
    broke = timezone.now() - timedelta(hours=1)
    merchant = destination(
        "merchant-7",
        breaker_threshold=3,
        consecutive_failures=5,
        paused_until=timezone.now() + timedelta(minutes=10),
    )
    other = destination("warehouse")
    since_the_break = [
        failed(merchant, "k-after-1", last_attempt_at=broke + timedelta(minutes=1)),
        # created before the break, but failed after it
        failed(
            merchant,
            "k-after-2",
            last_attempt_at=broke + timedelta(minutes=30),
            created_at=broke - timedelta(hours=3),
        ),
    ]
    before = failed(merchant, "k-before", last_attempt_at=broke - timedelta(minutes=1))
    pending = message(merchant, "k-pending", attempts=2, failures=2)
    elsewhere = failed(other, "k-elsewhere", last_attempt_at=broke + timedelta(minutes=1))
    now = timezone.now()

    # when
    with django_capture_on_commit_callbacks() as callbacks:
        count = destination_recover_since(destination=merchant, since=broke, by="alice", now=now)

    # then: the two failures since the break are due now with a fresh budget
    assert count == 2
    for row in since_the_break:
        row.refresh_from_db()
        assert (row.status, row.next_attempt_at, row.failures) == (MessageStatus.PENDING, now, 0)
    # the older failure, the other destination's and the pending one are untouched
    assert OutboxMessage.objects.get(pk=before.pk).status == MessageStatus.FAILED
    assert OutboxMessage.objects.get(pk=elsewhere.pk).status == MessageStatus.FAILED
    pending.refresh_from_db()
    assert (pending.status, pending.failures) == (MessageStatus.PENDING, 2)
    # the breaker's pause is over: half-open, so the next run sends one probe
    merchant.refresh_from_db()
    assert merchant.paused_until is None and merchant.consecutive_failures == 5
    assert destination_breaker(merchant).state == "half-open"
    assert len(callbacks) == 1


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
                (destination_id, key, event_type, payload, ordering_key, status, attempts,
                 failures, next_attempt_at, origin_source, origin_event_key, created_at,
                 last_error, discarded_by, discard_reason)
            SELECT %s[1 + g %% 4], 'order:' || g || ':paid:v1', 'order.paid', '{}',
                   'order:' || (g / 3), 'delivered', 1, 0, now(), '', '', now(), '', '', ''
            FROM generate_series(1, 40000) g
            """,
            [ids],
        )
        cursor.execute("ANALYZE webhook_receiver_outboxmessage")
    model_admin = site._registry[OutboxMessage]
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
    response = act(client, "retry_now_selected", row, reason="")

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
    page = act(client, "retry_now_selected", *rows)

    # then: a confirmation page, the selection on it, nothing changed yet
    assert page.status_code == 200
    assert "admin/webhook_receiver/action_confirmation.html" in [t.name for t in page.templates]
    content = page.content.decode()
    assert "order:ord_1:paid:v1" in content and "(left as it is)" in content
    assert 'value="Retry 3 messages now"' in content
    assert OutboxMessage.objects.get(pk=rows[0].pk).status == MessageStatus.FAILED

    # when: confirmed, with a reason
    before = timezone.now()
    response = act(client, "retry_now_selected", *rows, reason="merchant fixed the route")

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
    response = act(admin_client, "retry_now_selected", history["refused"], reason="")

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
    act(client, "discard_selected", row, reason="not wanted")
    assert client.get(button_url(row, "discard")).status_code == 403

    row.refresh_from_db()
    assert (row.status, row.discarded_by) == (MessageStatus.FAILED, "")


def test_discard_asks_for_a_reason_and_keeps_who_and_why(client, staff_user, history):
    # given
    user = staff_user("view_outboxmessage", "discard_outboxmessage")
    client.force_login(user)
    rows = history["refused"], history["paced"]

    # when: the first post shows the confirmation page
    page = act(client, "discard_selected", *rows)
    assert page.status_code == 200
    assert 'value="Discard 2 messages"' in page.content.decode()

    # when: confirmed without a reason
    refused = act(client, "discard_selected", *rows, reason="   ")

    # then: the page again, with the error; nothing discarded
    assert refused.status_code == 200
    assert refused.context["form"].errors == {"reason": ["This field is required."]}
    assert not OutboxMessage.objects.filter(status=MessageStatus.DISCARDED).exists()

    # when: with a reason
    before = timezone.now()
    response = act(client, "discard_selected", *rows, reason="order ord_1 was a test order")

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


# --- the destinations' list: health ------------------------------------------------------


@pytest.fixture
def fleet():
    """Three destinations with known figures.

    - merchant-7: breaker open for 10 min; 2 pending (one due, created 10 min ago, one
      deferred), 1 sending, 3 failed, 4 delivered, 1 discarded;
    - warehouse: half-open (at its threshold, pause over); 1 pending due, created 90 s ago;
    - crm: closed after 3 failures in a row; nothing open; disabled.
    """
    now = timezone.now()
    merchant = destination(
        "merchant-7",
        "https://merchant.example/hooks/outbox",
        breaker_threshold=5,
        consecutive_failures=7,
        paused_until=now + timedelta(minutes=10),
        last_success_at=now - timedelta(hours=1),
        last_failure_at=now - timedelta(minutes=1),
    )
    warehouse = destination(
        "warehouse", breaker_threshold=5, consecutive_failures=5, secrets=[SECRET]
    )
    crm = destination("crm", consecutive_failures=3, enabled=False)
    message(merchant, "m-due", created_at=now - timedelta(minutes=10))
    message(merchant, "m-deferred", next_attempt_at=now + timedelta(minutes=5))
    message(merchant, "m-sending", MessageStatus.SENDING, lease_until=now + timedelta(seconds=30))
    for n in range(3):
        failed(merchant, f"m-failed-{n}", last_attempt_at=now - timedelta(minutes=n))
    for n in range(4):
        message(merchant, f"m-delivered-{n}", MessageStatus.DELIVERED)
    message(merchant, "m-discarded", MessageStatus.DISCARDED)
    message(warehouse, "w-due", created_at=now - timedelta(seconds=90))
    return {"merchant": merchant, "warehouse": warehouse, "crm": crm}


def test_the_destination_list_shows_each_ones_health(admin_client, fleet):
    # when
    response = admin_client.get(DESTINATIONS)

    # then: the figures, as computed for the page
    assert response.status_code == 200
    figures = {
        d.name: (d.backlog, d.failed_count, d.oldest_eligible_at is not None)
        for d in response.context["cl"].result_list
    }
    assert figures == {
        "merchant-7": (3, 3, True),
        "warehouse": (1, 0, True),
        "crm": (0, 0, False),
    }
    rows = {d.name: d for d in response.context["cl"].result_list}
    model_admin = site._registry[WebhookDestination]
    assert model_admin.oldest_eligible(rows["merchant-7"]).endswith(">10 min</span>")
    assert model_admin.oldest_eligible(rows["warehouse"]).endswith(">1 min</span>")
    # and as shown: the breaker in words, the counts linking to the messages behind them
    content = response.content.decode()
    assert 'class="wr-line wr-open">open</span>' in content
    assert 'class="wr-line wr-half">half-open</span>' in content
    assert "3 failures in a row" in content
    merchant = fleet["merchant"].pk
    assert (
        f'class="wr-figure wr-failed" href="{MESSAGES}?destination__id__exact={merchant}'
        f'&amp;status__exact=failed">3</a>'
    ) in content
    assert "2 secrets" in content and "1 secret<" in content


def test_the_health_figures_take_the_same_queries_for_three_destinations_or_thirty(
    admin_client, fleet
):
    with CaptureQueriesContext(connection) as few:
        admin_client.get(DESTINATIONS)
    for n in range(27):
        dest = destination(f"extra-{n}")
        failed(dest, f"x-{n}", last_attempt_at=timezone.now())
    with CaptureQueriesContext(connection) as many:
        response = admin_client.get(DESTINATIONS)

    assert len(response.context["cl"].result_list) == 30
    assert len(many) == len(few)


def test_no_secret_is_ever_shown(admin_client, fleet):
    merchant = fleet["merchant"]

    pages = [admin_client.get(DESTINATIONS), admin_client.get(change_url(merchant))]

    for page in pages:
        content = page.content.decode()
        for secret in (SECRET, OLD_SECRET):
            assert secret not in content
            assert secret.removeprefix("whsec_") not in content
    # the change form names each by its last four characters
    assert secret_label(SECRET) == "whsec_…LaSw"
    assert "whsec_…LaSw" in pages[1].content.decode()
    assert "whsec_…b7oD" in pages[1].content.decode()


# --- the destinations' form ---------------------------------------------------------------


def form_data(**fields) -> dict:
    data = {
        "name": "merchant-9",
        "url": "https://merchant9.example/hooks",
        "enabled": "on",
        "event_types": "order.paid\norder.cancelled, order.refunded",
        "new_secrets": SECRET,
        "rate_count": 10,
        "rate_seconds": 1.0,
        "burst": 10,
        "max_in_flight": 4,
        "timeout_seconds": 10.0,
        "max_attempts": 12,
        "backoff_base_seconds": 2.0,
        "backoff_cap_seconds": 3600.0,
        "retry_after_cap_seconds": 300.0,
        "breaker_threshold": 10,
        "breaker_cooldown_seconds": 60.0,
        "replay_horizon_days": 30,
    }
    return {**data, **fields}


def test_a_destination_is_added_from_the_admin(admin_client):
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"), form_data()
    )

    assert response.status_code == 302, response.context["adminform"].form.errors
    dest = WebhookDestination.objects.get(name="merchant-9")
    assert dest.secrets == [SECRET]
    assert dest.event_types == ["order.paid", "order.cancelled", "order.refunded"]


def test_a_secret_that_is_not_one_is_refused_without_being_echoed(admin_client):
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"),
        form_data(new_secrets=f"{SECRET}\nsk_live_abcdef"),
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["new_secrets"] == [
        "Line 2 is not a Standard Webhooks secret: whsec_ followed by base64."
    ]
    assert "sk_live_abcdef" not in response.content.decode()
    assert not WebhookDestination.objects.filter(name="merchant-9").exists()


def test_a_rotation_adds_a_secret_then_drops_the_old_one(admin_client, fleet):
    # given: the merchant signs with two secrets
    from webhook_receiver.admin.forms import secret_fingerprint

    merchant = fleet["merchant"]
    url = change_url(merchant)
    fields = form_data(name="merchant-7", url=merchant.url, new_secrets=NEW_SECRET)

    # when: a new secret is added, both current ones kept
    keep = [secret_fingerprint(SECRET), secret_fingerprint(OLD_SECRET)]
    response = admin_client.post(url, {**fields, "keep_secrets": keep})

    # then
    assert response.status_code == 302, response.context["adminform"].form.errors
    merchant.refresh_from_db()
    assert merchant.secrets == [NEW_SECRET, SECRET, OLD_SECRET]

    # when: the old one is unticked, nothing added
    keep = [secret_fingerprint(NEW_SECRET), secret_fingerprint(SECRET)]
    admin_client.post(url, {**fields, "new_secrets": "", "keep_secrets": keep})

    # then: the history names the fields changed, never a secret
    merchant.refresh_from_db()
    assert merchant.secrets == [NEW_SECRET, SECRET]
    for log in LogEntry.objects.filter(object_id=str(merchant.pk)):
        for secret in (SECRET, OLD_SECRET, NEW_SECRET):
            assert secret not in log.change_message and secret not in log.get_change_message()


def test_a_destination_keeps_at_least_one_secret(admin_client, fleet):
    merchant = fleet["merchant"]

    response = admin_client.post(
        change_url(merchant),
        form_data(name="merchant-7", url=merchant.url, new_secrets="", keep_secrets=[]),
    )

    assert response.status_code == 200
    assert "A destination needs at least one secret" in response.content.decode()
    merchant.refresh_from_db()
    assert merchant.secrets == [SECRET, OLD_SECRET]


def test_saving_the_form_never_writes_back_the_relays_state(rf, admin_user, fleet):
    # given: the form's copy of the row, read before the relay recorded a success
    model_admin = site._registry[WebhookDestination]
    stale = WebhookDestination.objects.get(name="merchant-7")
    succeeded = timezone.now()
    WebhookDestination.objects.filter(pk=stale.pk).update(
        consecutive_failures=0, paused_until=None, last_success_at=succeeded, tokens=3.5
    )

    # when: the operator's change is saved from that copy
    stale.rate_count = 5
    request = rf.post("/")
    request.user = admin_user
    model_admin.save_model(request, stale, form=None, change=True)

    # then: the change is saved, the relay's state is the relay's
    fresh = WebhookDestination.objects.get(pk=stale.pk)
    assert fresh.rate_count == 5
    assert (fresh.consecutive_failures, fresh.paused_until, fresh.last_success_at) == (
        0,
        None,
        succeeded,
    )
    assert fresh.tokens == 3.5


def test_a_destination_cannot_be_deleted_from_the_admin(admin_client, fleet):
    url = reverse("admin:webhook_receiver_webhookdestination_delete", args=[fleet["crm"].pk])

    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert WebhookDestination.objects.filter(name="crm").exists()


# --- Recover since… ----------------------------------------------------------------------


def test_recover_since_is_behind_the_retry_permission(client, staff_user, fleet):
    client.force_login(staff_user("view_webhookdestination", "change_webhookdestination"))
    merchant = fleet["merchant"]

    assert "recover_since_selected" not in action_values(client.get(DESTINATIONS))
    assert 'id="wr-recover"' not in client.get(change_url(merchant)).content.decode()
    response = client.post(
        button_url(merchant, "recover"), {"post": "yes", "since": "2020-01-01T00:00"}
    )
    assert response.status_code == 403
    assert OutboxMessage.objects.filter(status=MessageStatus.FAILED).count() == 3


def test_recover_since_from_the_destination_page(client, staff_user, fleet):
    # given: a user who may retry messages; merchant-7 has three failures, 0, 1 and 2
    # minutes ago, and last worked an hour ago
    user = staff_user("view_webhookdestination", "retry_outboxmessage")
    client.force_login(user)
    merchant = fleet["merchant"]
    assert 'id="wr-recover"' in client.get(change_url(merchant)).content.decode()

    # when: the button's page
    page = client.get(button_url(merchant, "recover"))

    # then: the time is filled in with the last success, to the minute
    assert page.status_code == 200
    shown = f"{timezone.localtime(merchant.last_success_at):%Y-%m-%dT%H:%M}"
    assert f'type="datetime-local" name="since" value="{shown}"' in page.content.decode()

    # when: confirmed without a time, then with one that takes the last two failures
    missing = client.post(button_url(merchant, "recover"), {"post": "yes", "since": ""})
    assert missing.status_code == 200 and missing.context["form"].errors
    cut = timezone.localtime(timezone.now() - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%S")
    response = client.post(button_url(merchant, "recover"), {"post": "yes", "since": cut})

    # then
    assert response.status_code == 302 and response.url == change_url(merchant)
    requeued = OutboxMessage.objects.filter(
        destination=merchant, key__startswith="m-failed-", status=MessageStatus.PENDING
    )
    assert {m.key for m in requeued} == {"m-failed-0", "m-failed-1"}
    assert OutboxMessage.objects.get(key="m-failed-2").status == MessageStatus.FAILED
    [(level, text)] = flash(response)
    assert level == messages.SUCCESS
    assert text.startswith("merchant-7: recovered 2 failed messages since ")
    log = LogEntry.objects.get(user=user, object_id=str(merchant.pk))
    assert log.change_message.startswith("Recovered 2 failed messages since ")
    # the breaker's pause ended: half-open
    merchant.refresh_from_db()
    assert destination_breaker(merchant).state == "half-open"


def test_recover_since_as_an_action_on_several_destinations(admin_client, fleet):
    # given: the disabled crm has a failure too, and one from before the time given
    now = timezone.now()
    failed(fleet["crm"], "c-failed", last_attempt_at=now - timedelta(minutes=5))
    old = failed(fleet["crm"], "c-old", last_attempt_at=now - timedelta(days=2))
    since = timezone.localtime(now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    shown = f"{since.replace('T', ' ')}:00+00:00"

    # when: the action, then confirmed
    page = act(
        admin_client, "recover_since_selected", fleet["merchant"], fleet["crm"], url=DESTINATIONS
    )
    assert page.status_code == 200
    assert "no (it sends nothing until enabled)" in page.content.decode()
    response = act(
        admin_client,
        "recover_since_selected",
        fleet["merchant"],
        fleet["crm"],
        url=DESTINATIONS,
        since=since,
    )

    # then: each destination's failures since then, and a word on the disabled one
    assert response.status_code == 302
    assert flash(response) == [
        (
            messages.WARNING,
            f"crm: recovered 1 failed message since {shown}. It is disabled: they are sent "
            "once it is enabled again.",
        ),
        (messages.SUCCESS, f"merchant-7: recovered 3 failed messages since {shown}."),
    ]
    still_failed = OutboxMessage.objects.filter(status=MessageStatus.FAILED)
    assert [m.pk for m in still_failed] == [old.pk]


# --- in a browser --------------------------------------------------------------------------


def click_through(driver, element) -> None:
    """Click, and wait for the page the click leads to."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 15).until(expected_conditions.staleness_of(page))


def no_sideways_scroll(driver, box: str | None = "#changelist .results") -> None:
    page, window = driver.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert page <= window, (page, window)
    if box:
        inner, shown = driver.execute_script(
            f"const r = document.querySelector('{box}'); return [r.scrollWidth, r.clientWidth]"
        )
        assert inner <= shown, (inner, shown)


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
def test_the_message_page_shows_the_attempts_and_retries_now(
    admin_browser, live_server, history, broker
):
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

    # then: back on its page, pending again, and a relay run queued on the broker
    assert admin_browser.current_url.endswith(change_url(row))
    notice = admin_browser.find_element(By.CSS_SELECTOR, "ul.messagelist li")
    assert notice.text == "Queued 1 message to send now."
    row.refresh_from_db()
    assert (row.status, row.failures) == (MessageStatus.PENDING, 0)
    queued = json.loads(broker.lindex("celery", 0))
    assert queued["headers"]["task"] == "webhook_receiver.relay_destination"


@pytest.mark.django_db(transaction=True)
def test_the_destination_list_shows_health(admin_browser, live_server, fleet):
    from selenium.webdriver.common.by import By

    # when
    admin_browser.get(live_server.url + DESTINATIONS)

    # then
    no_sideways_scroll(admin_browser)

    def cells(name: str) -> dict[str, str]:
        row = admin_browser.find_element(By.XPATH, f"//tr[.//a[.='{name}']]")
        return {
            td.get_attribute("class").split()[0].removeprefix("field-"): td.text
            for td in row.find_elements(By.TAG_NAME, "td")
        }

    merchant = cells("merchant-7")
    assert merchant["breaker"].startswith("open\nuntil ")
    assert (merchant["backlog_figure"], merchant["failed_figure"]) == ("3", "3")
    assert merchant["oldest_eligible"] == "10 min"
    assert merchant["secret_count"] == "2 secrets"
    assert cells("warehouse")["breaker"] == "half-open\none probe at a time"
    assert cells("crm")["breaker"] == "closed\n3 failures in a row"
    assert cells("crm")["last_success"] == "never"
    screenshot(admin_browser, "outbox-destinations")

    # the destination's page and its Recover since… page
    click_through(admin_browser, admin_browser.find_element(By.LINK_TEXT, "merchant-7"))
    assert SECRET not in admin_browser.page_source
    screenshot(admin_browser, "outbox-destination-detail")
    health = admin_browser.find_element(By.CSS_SELECTOR, ".field-breaker_state")
    admin_browser.execute_script("arguments[0].scrollIntoView()", health)
    screenshot(admin_browser, "outbox-destination-health")
    click_through(admin_browser, admin_browser.find_element(By.ID, "wr-recover"))
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Recover failed messages"
    screenshot(admin_browser, "outbox-recover-confirmation")
