"""The failed-event admin: list, filters, search, detail page, and the replay and
discard actions with their permissions.

Every failed event here is made the way production makes it: a signed delivery to the
real endpoint whose processing fails (``failures``, the four-failure set of
tests/conftest.py, whose schema error's last attempt was on 2020-01-01).
"""

from __future__ import annotations

import html
import json

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from project.shop.models import InventoryLedgerEntry
from tests.support.admin import action_values, change_url, filter_case_id, flash
from tests.support.failing import CRASH, fail_schema, snapshot
from tests.support.http import post
from tests.support.signing import standard_headers
from webhook_receiver.handlers import WebhookEvent
from webhook_receiver.inbound.claim import event_claim_and_apply
from webhook_receiver.models import FailedEvent, FailureStatus, WebhookReceipt

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:webhook_receiver_failedevent_changelist")
TEMPLATE = "admin/webhook_receiver/action_confirmation.html"


def rows(response) -> set[str]:
    assert response.status_code == 200
    return {obj.event_key for obj in response.context["cl"].result_list}


def forget_messages(client) -> None:
    """Drop the messages earlier requests left unread, so that each post's are its own."""
    client.cookies.pop("messages", None)


def replay(client, *failed: FailedEvent, query: str = "", **extra):
    forget_messages(client)
    data = {"action": "replay_selected", "index": 0, "_selected_action": [f.pk for f in failed]}
    return client.post(CHANGELIST + query, {**data, **extra})


def discard(client, *failed: FailedEvent, reason: str | None = None, query: str = ""):
    forget_messages(client)
    data = {"action": "discard_selected", "_selected_action": [f.pk for f in failed]}
    if reason is None:
        data["index"] = 0  # the first post, from the changelist's action form
    else:
        data |= {"post": "yes", "reason": reason}  # the confirmation page's post
    return client.post(CHANGELIST + query, data)


# --- the list ----------------------------------------------------------------------------


def test_the_fixture_made_the_expected_records(failures):
    assert {k: f.status for k, f in failures.items()} == {
        "crash": FailureStatus.DEAD,
        "schema": FailureStatus.DEAD,
        "stripe": FailureStatus.DEAD,
        "retrying": FailureStatus.RETRYING,
    }
    assert failures["crash"].last_error_class == "builtins.RuntimeError"
    assert failures["schema"].last_error_class == "webhook_receiver.exceptions.InvalidPayload"
    assert failures["retrying"].next_attempt_at is not None


def test_changelist_shows_every_failed_event_with_its_columns(admin_client, failures):
    # when
    response = admin_client.get(CHANGELIST)

    # then
    assert rows(response) == {"msg_crash", "msg_schema", "evt_stripe_bad", "msg_retrying"}
    content = response.content.decode()
    for text in ("RuntimeError", "InvalidPayload", "test.crash", "inventory.reserved", "stripe"):
        assert text in content
    # the class's own name and the start of the message are shown; the full class and
    # message are the tooltip
    full = f"webhook_receiver.exceptions.InvalidPayload: {failures['schema'].last_error_message}"
    assert f'title="{html.escape(full)}">InvalidPayload: ' in content


FILTERS = [
    ({"source": "stripe"}, {"evt_stripe_bad"}),
    ({"status__exact": "retrying"}, {"msg_retrying"}),
    ({"status__exact": "dead"}, {"msg_crash", "msg_schema", "evt_stripe_bad"}),
    ({"event_type": CRASH}, {"msg_crash", "msg_retrying"}),
    ({"last_error_class": "builtins.RuntimeError"}, {"msg_crash", "msg_retrying"}),
    (
        {"last_error_class": "webhook_receiver.exceptions.InvalidPayload"},
        {"msg_schema", "evt_stripe_bad"},
    ),
    (
        {
            "last_attempt_at__gte": "2020-01-01 00:00:00+00:00",
            "last_attempt_at__lt": "2020-01-02 00:00:00+00:00",
        },
        {"msg_schema"},
    ),
    ({"last_attempt_at__year": "2020"}, {"msg_schema"}),  # the date hierarchy
    ({"source": "shop", "status__exact": "dead"}, {"msg_crash", "msg_schema"}),
]


@pytest.mark.parametrize(("query", "expected"), FILTERS, ids=filter_case_id)
def test_filters(admin_client, failures, query, expected):
    assert rows(admin_client.get(CHANGELIST, query)) == expected


def test_every_choice_of_every_filter_loads(admin_client, failures):
    # given: the five filters as the changelist offers them
    response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert [spec.title for spec in cl.filter_specs] == [
        "source",
        "status",
        "event type",
        "last error class",
        "last attempt at",
    ]

    # when / then: each link answers the list, not the "?e=1" error redirect
    for spec in cl.filter_specs:
        for choice in spec.choices(cl):
            followed = admin_client.get(CHANGELIST + choice["query_string"])
            assert followed.status_code == 200, (spec.title, choice)


def test_search_is_by_exact_event_key(admin_client, failures):
    assert rows(admin_client.get(CHANGELIST, {"q": "evt_stripe_bad"})) == {"evt_stripe_bad"}
    assert rows(admin_client.get(CHANGELIST, {"q": "msg_cr"})) == set()


# --- the detail page -------------------------------------------------------------------


def test_detail_shows_body_headers_and_error_history(admin_client, failures):
    # given: a dead event that then failed a replay too, so it has two attempts
    failed = failures["schema"]
    replay(admin_client, failed)
    failed.refresh_from_db()
    assert failed.attempts == 2

    # when
    response = admin_client.get(change_url(failed))

    # then: read-only, the body pretty-printed, headers one per line
    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="_save"' not in content
    pretty = json.dumps(json.loads(bytes(failed.body)), indent=2, sort_keys=True)
    assert '\n  "data": {\n' in pretty
    assert html.escape(pretty) in content
    headers = "\n".join(f"{k}: {v}" for k, v in sorted(failed.headers.items()))
    assert "Webhook-Id: msg_schema" in headers
    assert html.escape(headers) in content

    # and the error history: each attempt with its trigger, kind, exception and traceback
    first, second = failed.errors
    assert first["trigger"] == "delivery"
    assert second["trigger"] == "replay by admin"
    for entry in (first, second):
        assert f"<strong>Attempt {entry['attempt']}</strong> at {entry['at']}" in content
        assert f"{html.escape(entry['trigger'])} (permanent)" in content
        assert entry["exception"] == "webhook_receiver.exceptions.InvalidPayload"
        assert f"<code>{entry['exception']}</code>: {html.escape(entry['message'])}" in content
    assert "Traceback (most recent call last)" in first["traceback"]
    assert '<pre style="white-space: pre-wrap; margin: 0">Traceback' in content

    # and the operator fields
    assert "Last replayed by" in content
    assert "Discard reason" in content


def test_detail_escapes_a_hostile_json_body(admin_client, crash_handler, client):
    # given: a dead letter whose (verified, but untrusted) body carries markup
    failed = fail_schema(client, "msg_xss", sku="<script>alert('sku')</script>")

    # when
    content = admin_client.get(change_url(failed)).content.decode()

    # then
    assert "<script>alert" not in content
    assert "&lt;script&gt;alert(&#x27;sku&#x27;)&lt;/script&gt;" in content


def test_detail_shows_a_body_that_is_not_json_as_escaped_text(admin_client, client):
    # given: a signed body that is not JSON at all: dead at once, under its message id
    body = b"<script>alert(1)</script> not json"
    response = post(client, "shop", body, standard_headers(body, msg_id="msg_not_json"))
    assert response.json() == {"status": "dead_lettered", "event_key": "msg_not_json"}
    failed = FailedEvent.objects.get(event_key="msg_not_json")

    # when
    content = admin_client.get(change_url(failed)).content.decode()

    # then: the text as it came, escaped
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt; not json" in content


# --- nothing is added, changed or deleted from the admin ---------------------------------


def test_no_add_change_or_delete(admin_client, failures):
    # given
    failed = failures["crash"]
    delete_url = reverse("admin:webhook_receiver_failedevent_delete", args=[failed.pk])
    before = snapshot(failed)

    # when / then
    assert admin_client.get(reverse("admin:webhook_receiver_failedevent_add")).status_code == 403
    assert admin_client.get(delete_url).status_code == 403
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert admin_client.post(change_url(failed), {"status": "resolved"}).status_code == 403
    assert snapshot(failed) == before


def test_superuser_is_offered_replay_and_discard_but_never_delete(admin_client, failures):
    # when
    response = admin_client.get(CHANGELIST)

    # then: both actions are listed, and reachable from the page's HTML
    assert action_values(response) == {"", "replay_selected", "discard_selected"}
    content = response.content.decode()
    assert '<option value="replay_selected">' in content
    assert '<option value="discard_selected">' in content
    assert "delete_selected" not in content


def test_bulk_delete_posted_anyway_deletes_nothing(admin_client, failures):
    # when
    admin_client.post(
        CHANGELIST,
        {
            "action": "delete_selected",
            "index": 0,
            "_selected_action": [f.pk for f in failures.values()],
            "post": "yes",
        },
    )

    # then
    assert FailedEvent.objects.count() == len(failures)


# --- replay ------------------------------------------------------------------------------


def test_replay_after_the_fix_applies_once_and_records_who(admin_client, failures):
    # given: the handler works again
    failed = failures["crash"]
    assert not InventoryLedgerEntry.objects.filter(sku="CRASH", event_key="msg_crash").exists()

    # when
    response = replay(admin_client, failed)

    # then
    assert response.status_code == 302
    assert flash(response) == [
        (messages.SUCCESS, "Replayed 1 failed event: 1 applied."),
    ]
    failed.refresh_from_db()
    assert failed.status == FailureStatus.RESOLVED
    assert failed.resolution == "applied"
    assert failed.last_replayed_by == "admin"
    assert failed.last_replayed_at is not None
    assert failed.resolved_at == failed.last_replayed_at
    assert InventoryLedgerEntry.objects.filter(sku="CRASH", event_key="msg_crash").count() == 1
    assert WebhookReceipt.objects.filter(source="shop", event_key="msg_crash").exists()
    log = LogEntry.objects.get(object_id=str(failed.pk))
    assert (log.user.username, log.change_message) == ("admin", "Replayed: applied")


def test_replaying_an_already_applied_key_resolves_it_as_duplicate(admin_client, failures):
    # given: the key was applied meanwhile by a redelivery that found this row locked (by
    # a sweeper or a replay) and so could not resolve it
    failed = failures["crash"]
    event = WebhookEvent(
        source="shop",
        event_key="msg_crash",
        event_type=CRASH,
        payload=json.loads(bytes(failed.body)),
    )
    event_claim_and_apply(
        event=event, body=bytes(failed.body), headers=failed.headers, resolve_failures=False
    )
    assert snapshot(failed)[0] == FailureStatus.DEAD

    # when
    response = replay(admin_client, failed)

    # then: resolved as a duplicate, and the effect is still there once
    assert flash(response) == [(messages.SUCCESS, "Replayed 1 failed event: 1 duplicate.")]
    failed.refresh_from_db()
    assert (failed.status, failed.resolution) == (FailureStatus.RESOLVED, "duplicate")
    assert InventoryLedgerEntry.objects.filter(sku="CRASH", event_key="msg_crash").count() == 1


def test_a_failing_replay_keeps_the_event_dead_with_one_more_error(admin_client, failures):
    # given: a permanent error: the same bytes fail the same way
    failed = failures["schema"]

    # when
    response = replay(admin_client, failed)

    # then
    [(level, message)] = flash(response)
    assert level == messages.ERROR
    assert message.startswith("Replayed 1 failed event: 1 failed. Failed: shop:msg_schema (")
    assert "lines[0].quantity: Ensure this value is greater than or equal to 1." in message
    failed.refresh_from_db()
    assert failed.status == FailureStatus.DEAD
    assert failed.attempts == 2
    assert [e["trigger"] for e in failed.errors] == ["delivery", "replay by admin"]
    assert failed.last_replayed_by == "admin"


def test_replay_reports_counts_per_result(admin_client, failures):
    # given: one that applies, one that fails; then one that was already resolved
    replay(admin_client, failures["crash"])

    # when
    response = replay(admin_client, failures["retrying"], failures["schema"], failures["crash"])

    # then: the resolved one answers duplicate and does not apply again
    [(level, message)] = flash(response)
    assert level == messages.WARNING
    assert message == (
        "Replayed 3 failed events: 1 applied, 1 duplicate, 1 failed. "
        f"Failed: shop:msg_schema ({failures['schema'].last_error_message})."
    )
    assert snapshot(failures["retrying"])[0] == FailureStatus.RESOLVED
    assert snapshot(failures["schema"])[0] == FailureStatus.DEAD
    assert InventoryLedgerEntry.objects.filter(sku="CRASH", event_key="msg_crash").count() == 1


def test_replay_everything_matching_the_filter(admin_client, failures):
    # given: the list filtered to dead events of the shop; one row ticked, then "Select
    # all" (select_across) clicked
    query = "?source=shop&status__exact=dead"
    assert rows(admin_client.get(CHANGELIST + query)) == {"msg_crash", "msg_schema"}

    # when
    response = replay(admin_client, failures["crash"], query=query, select_across=1)

    # then: both matching rows were replayed, nothing else was touched
    assert response.status_code == 302
    assert response["Location"] == CHANGELIST + query
    [(_, message)] = flash(response)
    assert message.startswith("Replayed 2 failed events: 1 applied, 1 failed.")
    replayed = set(
        FailedEvent.objects.exclude(last_replayed_by="").values_list("event_key", flat=True)
    )
    assert replayed == {"msg_crash", "msg_schema"}
    assert snapshot(failures["stripe"])[3] == ""
    assert snapshot(failures["retrying"])[0] == FailureStatus.RETRYING


# --- discard -----------------------------------------------------------------------------


def test_discard_asks_for_a_reason_first(admin_client, failures):
    # when: the action is chosen in the list
    response = discard(admin_client, failures["crash"], failures["stripe"])

    # then: a confirmation page listing the events, with a reason to give
    assert response.status_code == 200
    assert response.template_name == TEMPLATE
    content = response.content.decode()
    assert "msg_crash" in content and "evt_stripe_bad" in content
    assert "msg_schema" not in content
    assert '<textarea name="reason"' in content
    assert 'name="action" value="discard_selected"' in content
    for failed in (failures["crash"], failures["stripe"]):
        assert f'name="_selected_action" value="{failed.pk}"' in content
    assert FailedEvent.objects.filter(status=FailureStatus.DISCARDED).count() == 0


@pytest.mark.parametrize("reason", ["", "   \n "])
def test_discard_without_a_reason_discards_nothing(admin_client, failures, reason):
    # when
    response = discard(admin_client, failures["crash"], reason=reason)

    # then: the form again, with its error
    assert response.status_code == 200
    assert response.template_name == TEMPLATE
    assert response.context["form"].errors == {"reason": ["This field is required."]}
    assert "This field is required." in response.content.decode()
    assert snapshot(failures["crash"])[0] == FailureStatus.DEAD


def test_discard_with_a_reason_records_who_when_and_why(admin_client, failures):
    # when
    response = discard(
        admin_client, failures["crash"], failures["stripe"], reason="  test data, sent twice "
    )

    # then
    assert response.status_code == 302
    assert flash(response) == [(messages.SUCCESS, "Discarded 2 failed events.")]
    for failed in (failures["crash"], failures["stripe"]):
        failed.refresh_from_db()
        assert failed.status == FailureStatus.DISCARDED
        assert failed.discarded_by == "admin"
        assert failed.discarded_at is not None
        assert failed.discard_reason == "test data, sent twice"
        assert failed.next_attempt_at is None
    assert snapshot(failures["schema"])[0] == FailureStatus.DEAD
    assert LogEntry.objects.filter(change_message="Discarded: test data, sent twice").count() == 2


def test_discard_stops_the_retries_of_a_retrying_event(admin_client, failures):
    # when
    discard(admin_client, failures["retrying"], reason="the order was cancelled by hand")

    # then
    failed = failures["retrying"]
    failed.refresh_from_db()
    assert (failed.status, failed.next_attempt_at) == (FailureStatus.DISCARDED, None)


def test_discard_leaves_a_resolved_event_as_it_is(admin_client, failures):
    # given
    replay(admin_client, failures["crash"])
    before = snapshot(failures["crash"])

    # when
    response = discard(admin_client, failures["crash"], failures["schema"], reason="cleanup")

    # then
    assert flash(response) == [
        (
            messages.WARNING,
            "Discarded 1 failed event. 1 was left as it was (already resolved or discarded).",
        )
    ]
    assert snapshot(failures["crash"]) == before
    assert snapshot(failures["schema"])[0] == FailureStatus.DISCARDED


def test_discard_everything_matching_the_filter(admin_client, failures):
    # given: filtered on one error class, "Select all" clicked
    query = "?last_error_class=webhook_receiver.exceptions.InvalidPayload"
    first = admin_client.post(
        CHANGELIST + query,
        {
            "action": "discard_selected",
            "index": 0,
            "select_across": 1,
            "_selected_action": [failures["schema"].pk],
        },
    )
    content = first.content.decode()
    assert "msg_schema" in content and "evt_stripe_bad" in content
    assert "msg_crash" not in content

    # when: confirmed with the ids the page carries
    response = discard(
        admin_client,
        failures["schema"],
        failures["stripe"],
        reason="schema errors from the old sender",
        query=query,
    )

    # then
    assert response.status_code == 302
    assert set(
        FailedEvent.objects.filter(status=FailureStatus.DISCARDED).values_list(
            "event_key", flat=True
        )
    ) == {"msg_schema", "evt_stripe_bad"}


# --- staff users and the two permissions --------------------------------------------------


def test_staff_without_view_permission_gets_403(client, staff_user, failures):
    client.force_login(staff_user())

    assert client.get(CHANGELIST).status_code == 403
    assert client.get(change_url(failures["crash"])).status_code == 403


def test_view_permission_alone_shows_but_cannot_act(client, staff_user, failures):
    # given
    client.force_login(staff_user("view_failedevent"))
    before = {key: snapshot(f) for key, f in failures.items()}

    # when
    listing = client.get(CHANGELIST)
    detail = client.get(change_url(failures["crash"]))
    replay(client, *failures.values())
    discard(client, *failures.values(), reason="not allowed")

    # then
    assert rows(listing) == {f.event_key for f in failures.values()}
    assert action_values(listing) == set()
    assert "replay_selected" not in listing.content.decode()
    assert detail.status_code == 200
    assert {key: snapshot(f) for key, f in failures.items()} == before


def test_replay_permission_replays_but_does_not_discard(client, staff_user, failures):
    # given
    client.force_login(staff_user("view_failedevent", "replay_failedevent"))
    listing = client.get(CHANGELIST)

    # when
    refused = discard(client, failures["schema"], reason="not allowed")
    replayed = replay(client, failures["crash"])

    # then
    assert action_values(listing) == {"", "replay_selected"}
    assert flash(refused) == [(messages.WARNING, "No action selected.")]
    assert snapshot(failures["schema"])[0] == FailureStatus.DEAD
    assert flash(replayed) == [(messages.SUCCESS, "Replayed 1 failed event: 1 applied.")]
    failed = failures["crash"]
    failed.refresh_from_db()
    assert (failed.status, failed.last_replayed_by) == (FailureStatus.RESOLVED, "operator")


def test_discard_permission_discards_but_does_not_replay(client, staff_user, failures):
    # given
    client.force_login(staff_user("view_failedevent", "discard_failedevent"))
    listing = client.get(CHANGELIST)
    before = snapshot(failures["crash"])

    # when
    refused = replay(client, failures["crash"])
    discarded = discard(client, failures["schema"], reason="bad data from the sender")

    # then
    assert action_values(listing) == {"", "discard_selected"}
    assert flash(refused) == [(messages.WARNING, "No action selected.")]
    assert snapshot(failures["crash"]) == before
    assert discarded.status_code == 302
    failed = failures["schema"]
    failed.refresh_from_db()
    assert (failed.status, failed.discarded_by) == (FailureStatus.DISCARDED, "operator")


def test_replay_and_discard_permissions_without_view_get_403(client, staff_user, failures):
    # given: the action permissions, but not the one to see the list
    client.force_login(staff_user("replay_failedevent", "discard_failedevent"))
    before = snapshot(failures["crash"])

    # when
    response = replay(client, failures["crash"])

    # then
    assert response.status_code == 403
    assert snapshot(failures["crash"]) == before
