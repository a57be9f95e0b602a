"""The outbox's destinations on the overview and in ``manage.py webhook_status``: each
one's state and the reasons, the verdict, the exit code and the page."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import screenshot
from tests.support.status import beat_seen, status_command  # noqa: F401 (fixture)
from webhook_receiver.core.states import State
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound.retirement import GONE_REASON
from webhook_receiver.watch.destinations import destination_statuses
from webhook_receiver.watch.sources import source_statuses
from webhook_receiver.watch.verdict import status_verdict

pytestmark = pytest.mark.django_db

OVERVIEW = reverse("admin:webhook_receiver_sourceoverview_changelist")
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


def destination(name: str, **fields) -> WebhookDestination:
    """A destination last changed an hour ago (a change gives the relay a pickup's time)."""
    dest = WebhookDestination.objects.create(name=name, url="http://127.0.0.1:9/", **fields)
    WebhookDestination.objects.filter(pk=dest.pk).update(
        updated_at=timezone.now() - timedelta(hours=1)
    )
    return dest


def message(dest: WebhookDestination, key: str, status: str = "pending", *, due_ago=MINUTE):
    now = timezone.now()
    return OutboxMessage.objects.create(
        destination=dest,
        key=key,
        event_type="order.paid",
        payload={},
        status=status,
        next_attempt_at=now - due_ago,
        created_at=now - due_ago,
    )


def a_bad_night() -> None:
    """One destination of each kind: fine, paused, with terminal messages, not being
    sent to, behind its traffic, disabled with a backlog."""
    now = timezone.now()
    # a message due 10 s ago, an answer 5 s ago: within the relay's pickup (about 30 s)
    fine = destination("fine", last_success_at=now - 5 * SECOND)
    message(fine, "fine-1", due_ago=10 * SECOND)
    destination(
        "paused", consecutive_failures=10, paused_until=now + 5 * MINUTE, last_failure_at=now
    )
    refused = destination("refused", last_success_at=now - MINUTE)
    message(refused, "refused-1", "failed")
    message(refused, "refused-2", "failed")
    stalled = destination("stalled", last_success_at=now - 45 * MINUTE)
    message(stalled, "stalled-1", due_ago=30 * MINUTE)
    behind = destination("behind", last_success_at=now - 2 * MINUTE / 60)
    message(behind, "behind-1", due_ago=25 * MINUTE)
    off = destination("off", enabled=False)
    message(off, "off-1")
    gone = destination(
        "gone",
        enabled=False,
        disabled_reason=GONE_REASON,
        disabled_at=now - 10 * MINUTE,
        last_failure_at=now - 10 * MINUTE,
    )
    message(gone, "gone-1", due_ago=20 * MINUTE)
    message(gone, "gone-2", due_ago=15 * MINUTE)


def test_each_destination_gets_its_state_and_reasons():
    # given
    a_bad_night()

    # when
    statuses = {d.name: d for d in destination_statuses()}

    # then: each the condition it is in, and only that
    codes = {name: [r.code for r in d.reasons] for name, d in statuses.items()}
    assert codes == {
        "behind": ["behind"],
        "fine": [],
        "gone": ["disabled_by_relay"],
        "off": ["disabled_with_backlog"],
        "paused": ["breaker_open"],
        "refused": ["messages_failed"],
        "stalled": ["relay_not_sending"],
    }
    assert statuses["fine"].state == State.OK
    assert statuses["stalled"].state == State.ALERT
    assert {d.state for name, d in statuses.items() if name not in ("fine", "stalled")} == {
        State.ATTENTION
    }
    assert statuses["refused"].reasons[0].summary == "2 messages failed"
    assert "one probe in 4 min" in statuses["paused"].reasons[0].text
    assert statuses["behind"].reasons[0].summary == "behind by 25 min"
    assert "not for 45 min" in statuses["stalled"].reasons[0].text
    assert statuses["gone"].reasons[0].summary == "disabled by the relay, 2 messages held"
    assert statuses["gone"].reasons[0].text == (
        f"disabled by the relay 10 min ago: {GONE_REASON}; 2 messages held until it is "
        "enabled again (or discarded)"
    )


def test_the_verdict_counts_destinations_after_the_sources():
    # given: the sources quiet (ok), one destination fine and one with failures
    now = timezone.now()
    destination("fine", last_success_at=now)
    refused = destination("refused", last_success_at=now)
    message(refused, "refused-1", "failed")

    # when
    verdict = status_verdict(source_statuses(), destination_statuses())

    # then
    assert verdict.state == State.ATTENTION
    assert verdict.text == "1 destination needs attention: refused — 1 message failed"

    # and once the failure is handled, every one is counted as OK
    OutboxMessage.objects.update(status="discarded")
    verdict = status_verdict(source_statuses(), destination_statuses())
    assert verdict.text == "All 5 sources and 2 destinations OK"


def test_webhook_status_lists_destinations_and_exits_2_for_a_relay_not_sending():
    # given
    a_bad_night()

    # when
    code, out = status_command()
    json_code, document = status_command("--json")

    # then: the table, the reasons, the exit code (ALERT: "stalled" is not being sent to)
    assert code == 2 == json_code
    stalled = next(line for line in out.splitlines() if line.startswith("stalled "))
    assert "ALERT" in stalled
    assert "DESTINATION" in out and "BREAKER" in out
    paused = next(line for line in out.splitlines() if line.startswith("paused "))
    assert "ATTENTION" in paused and "open 4 min" in paused
    assert "off (disabled)" in out
    assert "gone (disabled by the relay)" in out
    assert "refused: ATTENTION" in out
    assert "2 messages failed for good, waiting for Retry now or Discard" in out
    # the JSON's destinations, in its documented shape (docs/watching.md)
    destinations = {d["destination"]: d for d in json.loads(document)["destinations"]}
    assert set(destinations["refused"]) == {
        "destination",
        "enabled",
        "disabled_by_relay",
        "state",
        "reasons",
        "backlog",
        "failed",
        "held_back",
        "oldest_eligible_age_seconds",
        "due_age_seconds",
        "pickup_seconds",
        "breaker",
        "last_success_at",
        "last_failure_at",
        "record_failure",
    }
    assert destinations["refused"]["failed"] == 2
    # the pickup with the shipped defaults: the relay's poll 1 s, a token 0.1 s, timeout
    # 10 s, slack 15 s
    assert destinations["refused"]["pickup_seconds"] == 26.1
    assert destinations["stalled"]["due_age_seconds"] >= 30 * 60
    assert destinations["paused"]["breaker"]["state"] == "open"
    assert destinations["fine"]["state"] == "ok"
    assert destinations["refused"]["disabled_by_relay"] is None
    assert destinations["gone"]["disabled_by_relay"]["reason"] == GONE_REASON


def test_the_overview_shows_each_destination_and_links_to_its_messages(admin_client):
    # given
    a_bad_night()

    # when
    response = admin_client.get(OVERVIEW)

    # then: a row per destination, its state and reasons, and links that answer
    content = response.content.decode()
    assert response.status_code == 200
    assert 'id="wr-destinations"' in content
    for name in ("behind", "fine", "gone", "off", "paused", "refused", "stalled"):
        assert f'data-destination="{name}"' in content
    assert 'data-code="relay_not_sending"' in content
    assert 'data-code="disabled_by_relay"' in content
    assert "disabled by the relay" in content
    assert "open, probe in 4 min" in content
    refused = WebhookDestination.objects.get(name="refused")
    failed_list = (
        f"/admin/webhook_receiver/outboxmessage/?destination__id__exact={refused.pk}"
        "&amp;status__exact=failed"
    )
    assert failed_list in content
    listed = admin_client.get(failed_list.replace("&amp;", "&"))
    assert listed.status_code == 200
    assert listed.context["cl"].result_count == 2
    backlog = admin_client.get(
        "/admin/webhook_receiver/outboxmessage/"
        f"?destination__id__exact={refused.pk}&status__in=pending%2Csending"
    )
    assert backlog.status_code == 200


def test_without_destinations_the_overview_has_no_destination_table(admin_client):
    response = admin_client.get(OVERVIEW)
    assert 'id="wr-destinations"' not in response.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("beat_seen")
def test_destinations_on_the_overview_in_a_browser(admin_browser, live_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given
    a_bad_night()

    # when
    admin_browser.get(live_server.url + OVERVIEW)

    # then: the verdict names them, every row shows, and the page does not scroll sideways
    verdict = admin_browser.find_element(By.ID, "wr-verdict")
    assert "1 destination in alert: stalled — relay not sending" in verdict.text
    assert "5 destinations need attention" in verdict.text
    rows = admin_browser.find_elements(By.CSS_SELECTOR, "tr.wr-destination-row")
    states = {r.get_attribute("data-destination"): r.get_attribute("data-state") for r in rows}
    assert states == {
        "behind": "attention",
        "fine": "ok",
        "gone": "attention",
        "off": "attention",
        "paused": "attention",
        "refused": "attention",
        "stalled": "alert",
    }
    table = admin_browser.find_element(By.ID, "wr-destinations")
    admin_browser.execute_script("arguments[0].scrollIntoView()", table)
    screenshot(admin_browser, "overview-destinations")
    width = admin_browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= admin_browser.execute_script("return window.innerWidth")


def test_a_failed_message_holding_back_its_ordering_key_reads_as_that_cause(admin_client):
    # given: a 422 of order ord_1 (terminal) ten minutes ago holds its three later
    # messages back, as documented; they have been due for 30 min, and nothing was
    # answered since
    now = timezone.now()
    dest = destination("merchant", last_failure_at=now - 40 * MINUTE)
    failed = message(dest, "order:ord_1:paid:v1", "failed", due_ago=40 * MINUTE)
    for n in range(2, 5):
        message(dest, f"order:ord_1:fulfilled:v{n}", due_ago=30 * MINUTE)
    OutboxMessage.objects.update(ordering_key="order:ord_1")
    # and one without an ordering key, due 10 s ago: sendable, not held back
    message(dest, "order:ord_2:paid:v1", due_ago=10 * SECOND)

    # when
    (status,) = destination_statuses()

    # then: the failed message and what it holds back, not "the relay is not sending"
    assert [r.code for r in status.reasons] == ["messages_failed", "held_back"]
    held = status.reasons[1]
    assert held.summary == "holding back 3"
    assert held.text == (
        "failed message order:ord_1:paid:v1 holds back 3 later messages of its ordering key "
        "order:ord_1: Retry now or Discard it to let them go"
    )
    # the oldest due is the sendable one, 10 s old
    assert status.held_back == 3
    assert 10 * SECOND <= status.oldest_eligible_age < MINUTE
    assert status.as_dict()["held_back"] == 3

    # and the overview links the reason to the failed message itself
    content = admin_client.get(OVERVIEW).content.decode()
    assert 'data-code="held_back"' in content and 'data-code="relay_not_sending"' not in content
    link = f"/admin/webhook_receiver/outboxmessage/{failed.pk}/change/"
    assert link in content
    assert admin_client.get(link).status_code == 200


def test_failed_messages_of_several_ordering_keys_are_counted_together():
    # given: two failed messages, each holding one later message back
    dest = destination("merchant")
    for order in ("ord_1", "ord_2"):
        message(dest, f"order:{order}:paid:v1", "failed", due_ago=30 * MINUTE)
        message(dest, f"order:{order}:fulfilled:v2", due_ago=20 * MINUTE)
        OutboxMessage.objects.filter(key__contains=order).update(ordering_key=f"order:{order}")

    # when
    (status,) = destination_statuses()

    # then
    held = next(r for r in status.reasons if r.code == "held_back")
    assert held.text.startswith(
        "2 failed messages hold back 2 later messages of their ordering keys (the oldest: "
        "order:ord_1:paid:v1, ordering key order:ord_1)"
    )
    assert status.oldest_eligible_at is None


@pytest.mark.django_db(transaction=True)
def test_held_back_and_unrecorded_destinations_in_a_browser(admin_browser, live_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given: one destination held back by a failed message, one whose answers the
    # database refused to record a minute ago
    now = timezone.now()
    held = destination("held", last_failure_at=now - 40 * MINUTE)
    message(held, "order:ord_1:paid:v1", "failed", due_ago=40 * MINUTE)
    message(held, "order:ord_1:fulfilled:v2", due_ago=30 * MINUTE)
    OutboxMessage.objects.update(ordering_key="order:ord_1")
    destination(
        "unrecorded",
        last_success_at=now - 20 * MINUTE,
        record_failed_at=now - MINUTE,
        record_error="OperationalError: canceling statement due to lock timeout",
    )

    # when
    admin_browser.get(live_server.url + OVERVIEW)

    # then: each reason on its line, the held-back one linking to the failed message
    reasons = {
        li.get_attribute("data-code"): li
        for li in admin_browser.find_elements(By.CSS_SELECTOR, "#wr-destinations li")
    }
    assert set(reasons) == {"messages_failed", "held_back", "record_failing"}
    assert "holds back 1 later message" in reasons["held_back"].text
    link = reasons["held_back"].find_element(By.TAG_NAME, "a").get_attribute("href")
    assert link.endswith("/change/")
    assert "could not record its answers: OperationalError" in reasons["record_failing"].text
    table = admin_browser.find_element(By.ID, "wr-destinations")
    admin_browser.execute_script("arguments[0].scrollIntoView()", table)
    screenshot(admin_browser, "overview-held-back-and-unrecorded")
    width = admin_browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= admin_browser.execute_script("return window.innerWidth")


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("the breaker's pause ended 10 s ago", {"paused_until": -10}),
        ("enabled again 10 s ago", {"updated_at": -10}),
        ("every slot leased until 10 s ago", {"leases": -10}),
        ("every slot leased for 20 s more", {"leases": 20}),
    ],
)
def test_a_relay_owes_no_answer_before_its_pause_its_leases_or_a_change_end(why, change):
    # given: a message due for 30 min, the last answer 45 min ago, and one reason the
    # relay could not answer until just now (or yet)
    now = timezone.now()
    dest = destination("merchant", last_failure_at=now - 45 * MINUTE, max_in_flight=2)
    message(dest, "due", due_ago=30 * MINUTE)
    if "leases" in change:
        for n in range(2):
            leased = message(dest, f"leased-{n}", "sending", due_ago=31 * MINUTE)
            leased.lease_until = now + change["leases"] * SECOND
            leased.save()
    else:
        moment = now + next(iter(change.values())) * SECOND
        WebhookDestination.objects.filter(pk=dest.pk).update(**{next(iter(change)): moment})

    # when
    (status,) = destination_statuses()

    # then: behind its backlog, not "not sending" (a pickup, 30 s, has not passed since)
    assert [r.code for r in status.reasons] == ["behind"], why


def test_with_a_slot_free_a_lease_does_not_excuse_the_silence():
    # given: one of two slots leased for 20 s more, and a message due for 30 min
    now = timezone.now()
    dest = destination("merchant", last_failure_at=now - 45 * MINUTE, max_in_flight=2)
    message(dest, "due", due_ago=30 * MINUTE)
    leased = message(dest, "leased", "sending", due_ago=31 * MINUTE)
    leased.lease_until = now + 20 * SECOND
    leased.save()

    # then: a free slot and nothing sent: not sending
    (status,) = destination_statuses()
    assert [r.code for r in status.reasons] == ["relay_not_sending"]
