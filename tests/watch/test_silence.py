"""Silence alerts: a source that goes quiet opens one alert and one notice; accepted
traffic resolves it with one recovery notice.

Events go through the real endpoint (signed with the standardwebhooks library, or signed
wrongly), and checks travel in time through ``check_silence(now=…)``. The notifiers are
the real ones: log records (caplog), mail (Django's locmem outbox), signals (a
connected receiver).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from tests.settings import SHOP_SECRET
from tests.support import handlers as test_handlers
from tests.support.http import post
from tests.support.signing import event_body, standard_headers
from tests.support.silence import MINUTE, WRONG_SECRET, send_event, send_forged, send_stale
from webhook_receiver.inbound.failures import failed_event_replay
from webhook_receiver.models import FailedEvent, RequestAudit, SilenceAlert, WebhookReceipt
from webhook_receiver.tasks import check_silence_task
from webhook_receiver.watch.notifiers import Notifier
from webhook_receiver.watch.silence import check_silence
from webhook_receiver.watch.traffic import last_accepted_at

pytestmark = pytest.mark.django_db

BERLIN = ZoneInfo("Europe/Berlin")


# --- opening, once ------------------------------------------------------------------------


def test_a_silent_source_opens_one_alert_after_its_window_and_no_more(client, watch, heard, check):
    # given: an accepted event, then nothing
    last = send_event(client)

    # when / then: inside the window, nothing
    assert check(last + 19 * MINUTE)["shop"].state == "receiving"
    assert not SilenceAlert.objects.exists()

    # when / then: past it, one alert and one notice
    opened = check(last + 21 * MINUTE)["shop"]
    assert opened.state == "opened"
    alert = SilenceAlert.objects.get()
    assert (alert.source, alert.last_accepted_at, alert.silence_after_seconds) == (
        "shop",
        last,
        1200,
    )
    assert alert.opened_at == alert.opened_notice_sent_at == last + 21 * MINUTE
    assert alert.resolved_at is None and alert.rejected_total == 0
    assert heard == [("opened", "shop", alert.pk)]

    # when / then: later checks refresh it and send nothing
    assert check(last + 30 * MINUTE)["shop"].state == "open"
    assert check(last + 90 * MINUTE)["shop"].state == "open"
    alert.refresh_from_db()
    assert SilenceAlert.objects.count() == 1
    assert alert.last_checked_at == last + 90 * MINUTE
    assert heard == [("opened", "shop", alert.pk)]


def test_a_source_that_never_accepted_an_event_and_is_not_refused_opens_no_alert(watch, check):
    # given: shop configured, and no request ever

    # when
    results = check(timezone.now() + timedelta(days=3))

    # then: nothing to miss yet
    assert results["shop"].state == "never_accepted"
    assert not SilenceAlert.objects.exists()


def test_a_source_without_a_window_is_not_watched(client, watch, check):
    # given: SILENCE_AFTER_SECONDS 0
    watch(SILENCE_AFTER_SECONDS=0)
    last = send_event(client)

    # when
    results = check(last + timedelta(days=1))

    # then
    assert "shop" not in results
    assert not SilenceAlert.objects.exists()


# --- silence made of refusals ----------------------------------------------------------------


def test_refused_requests_are_silence_and_the_alert_counts_them_by_reason(
    client, watch, check, mailoutbox
):
    # given: the last accepted event 30 minutes ago, one refusal before the window
    send_event(client)
    WebhookReceipt.objects.update(received_at=timezone.now() - 30 * MINUTE)
    send_forged(client)
    RequestAudit.objects.filter(verification="invalid_signature").update(
        received_at=timezone.now() - 40 * MINUTE
    )
    # and since then, requests keep coming, every one refused
    send_forged(client, count=3)
    send_stale(client, count=2)

    # when
    result = check()["shop"]

    # then: an alert, with the refusals of the window, by reason
    assert result.state == "opened"
    alert = SilenceAlert.objects.get()
    assert alert.rejected_counts == {"invalid_signature": 3, "timestamp_out_of_tolerance": 2}
    assert alert.rejected_total == 5
    # and the mail says what they mean, and never a secret
    (mail,) = mailoutbox
    assert "invalid_signature: 3\n    the sender signs with a secret we do not hold" in mail.body
    assert "timestamp_out_of_tolerance: 2" in mail.body
    assert SHOP_SECRET not in mail.body and WRONG_SECRET not in mail.body


def test_a_source_refused_from_its_first_request_opens_an_alert_that_an_event_resolves(
    client, watch, heard, check
):
    # given: a sender that has never got through: every request is refused
    send_forged(client, count=2)

    # when
    opened = check()["shop"]

    # then: an alert with no last accepted event
    assert opened.state == "opened"
    alert = SilenceAlert.objects.get()
    assert alert.last_accepted_at is None
    assert alert.rejected_counts == {"invalid_signature": 2}

    # when: the secret is fixed and an event gets through
    event_at = send_event(client)
    resolved = check()["shop"]

    # then
    assert resolved.state == "resolved"
    alert.refresh_from_db()
    assert alert.resolved_by_event_at == event_at
    assert heard == [("opened", "shop", alert.pk), ("resolved", "shop", alert.pk)]


# --- active hours ------------------------------------------------------------------------------


def _next(weekday: int, hour: int, minute: int = 0) -> datetime:
    """A moment in Berlin on the given weekday (Monday 0), at least a week from now."""
    day = timezone.now().astimezone(BERLIN) + timedelta(days=7)
    day += timedelta(days=(weekday - day.weekday()) % 7)
    return day.replace(hour=hour, minute=minute, second=0, microsecond=0)


def test_silence_outside_active_hours_opens_no_alert_and_inside_it_does(
    client, watch, heard, check
):
    # given: shop is expected to send on weekdays from 08:00 to 20:00 in Berlin
    hours = {"DAYS": "mon-fri", "START": "08:00", "END": "20:00", "TIME_ZONE": BERLIN.key}
    watch(ACTIVE_HOURS=hours)
    send_event(client)
    saturday, monday = _next(5, 12), _next(0, 12)

    # when / then: a quiet weekend is expected
    assert check(saturday)["shop"].state == "outside_active_hours"
    # and so are the first 20 minutes of Monday: the window must lie inside the hours
    assert check(monday.replace(hour=8, minute=10))["shop"].state == "outside_active_hours"
    assert not SilenceAlert.objects.exists()

    # when / then: a silent Monday noon is not
    assert check(monday)["shop"].state == "opened"
    # and the open alert stays open after hours: only accepted traffic ends it
    assert check(monday.replace(hour=21))["shop"].state == "open"
    alert = SilenceAlert.objects.get()
    assert alert.resolved_at is None
    assert heard == [("opened", "shop", alert.pk)]


def test_active_hours_of_days_alone_are_those_days_all_day(client, watch, heard, check):
    # given: shop is expected to send on weekdays, no span given (00:00 to 00:00)
    watch(ACTIVE_HOURS={"DAYS": "mon-fri", "TIME_ZONE": BERLIN.key})
    send_event(client)

    # when / then: a silent Sunday is expected, a silent Tuesday at 03:00 is not
    assert check(_next(6, 12))["shop"].state == "outside_active_hours"
    assert check(_next(1, 3))["shop"].state == "opened"


# --- resolving, once ---------------------------------------------------------------------------


def test_an_accepted_event_resolves_the_alert_with_one_recovery_notice(client, watch, heard, check):
    # given: an open alert, the last accepted event 25 minutes ago
    send_event(client)
    WebhookReceipt.objects.update(received_at=timezone.now() - 25 * MINUTE)
    check()
    alert = SilenceAlert.objects.get()

    # when: the sender is back, and two checks follow
    back = send_event(client, order="ord_2")
    resolved_at = timezone.now()
    first = check(resolved_at)["shop"]
    second = check(resolved_at + MINUTE)["shop"]

    # then: the first resolved it, the second found nothing to do
    assert (first.state, second.state) == ("resolved", "receiving")
    alert.refresh_from_db()
    assert alert.resolved_at == alert.recovery_notice_sent_at == resolved_at
    assert alert.resolved_by_event_at == back
    assert heard == [("opened", "shop", alert.pk), ("resolved", "shop", alert.pk)]

    # and a later silence is a new incident, with its own alert
    assert check(back + 21 * MINUTE)["shop"].state == "opened"
    assert SilenceAlert.objects.count() == 2


def test_a_replayed_dead_letter_is_not_taken_for_traffic(client, watch, settings, heard, check):
    # given: an event the handler could not apply, held dead since it arrived half an
    # hour ago; the sender has been quiet since, and the alert is open
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {"test.crash": "tests.support.handlers.fails_after_writing"},
        "RETRY_MAX_ATTEMPTS": 1,
    }
    test_handlers.failures_left["count"] = 1
    body = event_body("test.crash", order_id="ord_dead")
    assert post(client, "shop", body, standard_headers(body)).status_code == 202  # held
    arrived = timezone.now() - 30 * MINUTE
    FailedEvent.objects.update(first_attempt_at=arrived)
    assert check()["shop"].state == "opened"
    alert = SilenceAlert.objects.get()

    # when: an operator replays it, the cause fixed
    failed = FailedEvent.objects.get(status="dead")
    assert failed_event_replay(failed_id=failed.pk, actor="alice").result == "applied"

    # then: its receipt keeps the sender's delivery time, and the silence goes on
    assert WebhookReceipt.objects.get(event_key=failed.event_key).received_at == arrived
    assert last_accepted_at("shop") == arrived
    assert check()["shop"].state == "open"
    assert heard == [("opened", "shop", alert.pk)]


# --- the notifiers -----------------------------------------------------------------------------


def test_the_log_notifier_writes_one_error_line_and_one_warning_line(client, watch, check, caplog):
    # given
    watch(notifiers=["log"])
    send_event(client)
    WebhookReceipt.objects.update(received_at=timezone.now() - 21 * MINUTE)
    send_forged(client)

    # when
    with caplog.at_level(logging.INFO, logger="webhook_receiver"):
        check()
        send_event(client, order="ord_2")
        check()

    # then
    lines = [r for r in caplog.records if r.name == "webhook_receiver.watch.notifiers"]
    assert [r.levelno for r in lines] == [logging.ERROR, logging.WARNING]
    opened, resolved = (r.getMessage() for r in lines)
    assert "source shop silent since" in opened and "(21 min)" in opened
    assert "window 20 min" in opened
    assert "refused in the last 20 min: 1 (invalid_signature: 1)" in opened
    assert "source shop accepts events again" in resolved
    assert lines[0].webhook["source"] == "shop"


def test_the_mail_admins_notifier_mails_what_happened_and_where_to_look(
    client, watch, check, mailoutbox
):
    # given
    watch(notifiers=["mail_admins"])
    last = send_event(client)

    # when
    check(last + 21 * MINUTE)

    # then: one mail to ADMINS an operator can act on
    (opened,) = mailoutbox
    assert opened.to == ["ops@example.com"]
    assert "[webhook_receiver] shop silent for 21 min" in opened.subject
    assert "has accepted no event for longer than 20 min" in opened.body
    assert f"Last accepted event:  {timezone.localtime(last):%Y-%m-%d %H:%M:%S}" in opened.body
    assert "no request reached us at all" in opened.body
    alerts = reverse("admin:webhook_receiver_silencealert_changelist")
    assert f"{alerts}?source=shop" in opened.body
    assert "python manage.py webhook_status" in opened.body

    # when: the sender is back
    send_event(client, order="ord_2")
    check(last + 22 * MINUTE)

    # then: one more mail
    assert len(mailoutbox) == 2
    assert "[webhook_receiver] shop receiving again" in mailoutbox[1].subject
    assert "accepts events again" in mailoutbox[1].body


def test_the_signal_notifier_sends_both_signals_with_the_alert(client, watch, heard, check):
    # given
    watch(notifiers=["signal"])
    last = send_event(client)

    # when
    check(last + 21 * MINUTE)
    send_event(client, order="ord_2")
    check(last + 22 * MINUTE)

    # then
    alert = SilenceAlert.objects.get()
    assert heard == [("opened", "shop", alert.pk), ("resolved", "shop", alert.pk)]


class BrokenNotifier(Notifier):
    """A pager whose API is down."""

    def alert_opened(self, alert):
        raise ConnectionError("pager unreachable")


def test_a_failing_notifier_is_logged_and_the_others_still_hear_of_it(
    client, watch, heard, check, caplog
):
    # given
    watch(notifiers=["tests.watch.test_silence.BrokenNotifier", "signal"])
    last = send_event(client)

    # when
    with caplog.at_level(logging.ERROR, logger="webhook_receiver"):
        result = check(last + 21 * MINUTE)["shop"]

    # then: the check went on, the signal went out, the failure is in the log
    assert result.state == "opened"
    alert = SilenceAlert.objects.get()
    assert heard == [("opened", "shop", alert.pk)]
    assert alert.opened_notice_sent_at is not None
    (failure,) = [r for r in caplog.records if r.name == "webhook_receiver.watch.silence"]
    assert "BrokenNotifier failed on the opened alert" in failure.getMessage()
    assert "pager unreachable" in failure.exc_text


@pytest.mark.parametrize(
    "name", ["pager", "tests.watch.test_silence.nowhere", "webhook_receiver.models.SilenceAlert"]
)
def test_a_notifier_that_is_not_one_is_improperly_configured(client, watch, name):
    # given
    watch(notifiers=["log", name])
    last = send_event(client)

    # when / then: refused before anything is written
    with pytest.raises(ImproperlyConfigured, match=r"WEBHOOK_RECEIVER\['NOTIFIERS'\]"):
        check_silence(now=last + 21 * MINUTE)
    assert not SilenceAlert.objects.exists()


# --- the task ----------------------------------------------------------------------------------


def test_the_check_silence_task_returns_each_sources_state(client, watch, heard):
    # given: shop silent for half an hour
    send_event(client)
    WebhookReceipt.objects.update(received_at=timezone.now() - 30 * MINUTE)

    # when: the task runs in this process (beat runs it every minute)
    summary = check_silence_task()

    # then: every test source with a window is listed (they all have the default 20 min)
    assert summary == {
        "github": "never_accepted",
        "keyed": "never_accepted",
        "shop": "opened",
        "small": "never_accepted",
        "stripe": "never_accepted",
    }
    assert SilenceAlert.objects.filter(source="shop", resolved_at__isnull=True).count() == 1


# --- concurrency -------------------------------------------------------------------------------


def _two_checks_at_once(at: datetime) -> list[str]:
    """Two checkers in two threads, each with its own connection, started together by a
    barrier and held at the alerts table (a lock this thread takes) until both have
    read and both are about to write: a real race for the same row, every time."""
    barrier = threading.Barrier(2)
    states: list[str] = []

    def checker() -> None:
        barrier.wait()
        try:
            states.extend(r.state for r in check_silence(now=at) if r.source == "shop")
        finally:
            connection.close()

    threads = [threading.Thread(target=checker) for _ in range(2)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOCK TABLE webhook_receiver_silencealert IN SHARE ROW EXCLUSIVE MODE")
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        waiting = 0
        while waiting < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted "
                "AND relation = 'webhook_receiver_silencealert'::regclass"
            )
            waiting = cursor.fetchone()[0]
        assert waiting == 2, "both checkers should be waiting to write"
    for thread in threads:
        thread.join(timeout=30)
    return sorted(states)


@pytest.mark.postgres_only("two sessions racing for one row, held by a table lock")
@pytest.mark.django_db(transaction=True)
def test_two_checks_at_once_open_one_alert_and_resolve_it_once(client, watch, heard, mailoutbox):
    # given: shop silent past its window
    last = send_event(client)

    # when: two checkers find it silent at the same moment
    opened = _two_checks_at_once(last + 21 * MINUTE)

    # then: the database let one open it; the other's insert was refused
    assert opened == ["open", "opened"]
    alert = SilenceAlert.objects.get()
    assert heard == [("opened", "shop", alert.pk)]
    assert len(mailoutbox) == 1

    # when: the sender is back, and two checkers see it at the same moment
    send_event(client, order="ord_2")
    resolved = _two_checks_at_once(last + 22 * MINUTE)

    # then: one resolved it, and one recovery notice went out
    assert resolved == ["receiving", "resolved"]
    alert.refresh_from_db()
    assert alert.resolved_at is not None and alert.recovery_notice_sent_at is not None
    assert heard == [("opened", "shop", alert.pk), ("resolved", "shop", alert.pk)]
    assert len(mailoutbox) == 2


# --- the way an operator sees it ---------------------------------------------------------------


def test_a_sender_that_stops_pages_once_and_its_return_is_announced_once(
    client, watch, check, mailoutbox
):
    # given: a sender posting signed events, then stopping
    for n in range(3):
        last = send_event(client, order=f"ord_{n}")

    # when / then: five minutes later, nothing to say
    assert check(last + 5 * MINUTE)["shop"].state == "receiving"
    assert mailoutbox == []

    # when / then: 21 minutes later, one page
    assert check(last + 21 * MINUTE)["shop"].state == "opened"
    assert [m.subject for m in mailoutbox] == ["[Django] [webhook_receiver] shop silent for 21 min"]

    # when / then: 30 minutes later, still one alert and no second page
    assert check(last + 30 * MINUTE)["shop"].state == "open"
    assert SilenceAlert.objects.count() == 1
    assert len(mailoutbox) == 1

    # when: the sender posts again, and the next check runs
    send_event(client, order="ord_back")
    assert check(last + 31 * MINUTE)["shop"].state == "resolved"

    # then: one recovery mail, and the alert is closed
    assert len(mailoutbox) == 2
    assert mailoutbox[1].subject.startswith("[Django] [webhook_receiver] shop receiving again")
    assert SilenceAlert.objects.get().resolved_at == last + 31 * MINUTE


def test_a_silence_alert_is_sent_to_the_ops_destination_once_per_state(
    client, watch, check, settings
):
    # given: shop watched, with the outbox notifier, and an ops destination
    from webhook_receiver.models import OutboxMessage, WebhookDestination

    watch(notifiers=("outbox",))
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "OPS_DESTINATION": "ops"}
    ops = WebhookDestination.objects.create(name="ops", url="http://127.0.0.1:9/ops")
    last = send_event(client)

    # when: silent past the window, checked twice, then traffic returns
    check(last + 21 * MINUTE)
    check(last + 30 * MINUTE)
    send_event(client, order="ord_back")
    check()

    # then: one message when it opened, one when it resolved
    messages = list(OutboxMessage.objects.filter(destination=ops).order_by("id"))
    assert [m.event_type for m in messages] == ["silence.alert_opened", "silence.alert_resolved"]
    opened = messages[0].payload
    assert opened["type"] == "silence.alert_opened"
    assert opened["data"]["source"] == "shop"
    assert "silent" in opened["data"]["summary"]
