"""Endpoints that retire themselves, against a real local merchant: a 410 Gone disables
the destination and holds its messages; a destination failing with no success for
DISABLE_AFTER_FAILING_DAYS is warned of, then disabled; enabling it (the operation, the
command) sends what it held, in order."""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from webhook_receiver.models import MessageStatus, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.operations import destination_disable, destination_enable
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record, relay_send
from webhook_receiver.outbound.relay.wakeups import due_destinations
from webhook_receiver.outbound.retirement import GONE_REASON
from webhook_receiver.outbound.tenancy import EVERY_TENANT

pytestmark = pytest.mark.django_db
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def ops(settings) -> WebhookDestination:
    """An ops destination (never relayed here: its notices are read from the table)."""
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "OPS_DESTINATION": "ops"}
    return WebhookDestination.objects.create(name="ops", url="http://127.0.0.1:9/ops")


def merchant(url: str, **fields) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name="merchant", url=url, secrets=[SECRET], event_types=["order.paid"], **fields
    )


def admit(dest, key, ordering_key=None):
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(dest, "order.paid", key, {"id": key}, ordering_key=ordering_key)


def statuses(dest) -> list[tuple[str, str]]:
    return list(
        OutboxMessage.objects.filter(destination=dest).order_by("id").values_list("key", "status")
    )


def notices(ops) -> list[tuple[str, dict]]:
    rows = OutboxMessage.objects.filter(destination=ops).order_by("id")
    return [(m.event_type, m.payload["data"]) for m in rows]


def test_a_410_disables_the_destination_and_holds_its_messages(receiver, ops, caplog):
    # given: three messages, one in flight at a time, two in one ordering key
    dest = merchant(receiver.url, max_in_flight=1)
    for key, ordering in (("k1", "order-1"), ("k2", None), ("k3", "order-1")):
        admit(dest, key, ordering)
    receiver.answer(410, key="k1")

    # when
    with (
        caplog.at_level(logging.WARNING, logger="webhook_receiver.outbound.retirement"),
        TestCase.captureOnCommitCallbacks(execute=True),
    ):
        relay_destination(destination_id=dest.pk)

    # then: disabled with its reason and time; nothing failed, nothing more sent
    dest.refresh_from_db()
    assert not dest.enabled and dest.disabled_by_relay
    assert dest.disabled_reason == GONE_REASON
    assert dest.disabled_at is not None
    assert receiver.keys() == ["k1"]
    assert statuses(dest) == [("k1", "pending"), ("k2", "pending"), ("k3", "pending")]
    held = OutboxMessage.objects.get(key="k1")
    assert (held.last_status_code, held.failures) == (410, 0)
    # one notice, one log line
    [(event_type, data)] = notices(ops)
    assert event_type == "outbox.destination_disabled"
    assert data["destination"] == "merchant" and data["reason"] == GONE_REASON
    [line] = [r for r in caplog.records if r.name.endswith("retirement")]
    assert "destination merchant disabled: answered 410 Gone" in line.getMessage()

    # when: the poll (the notice aside) and another run come
    OutboxMessage.objects.filter(destination=ops).delete()
    assert due_destinations() == []
    relay_destination(destination_id=dest.pk)

    # then: still held
    assert receiver.keys() == ["k1"]
    assert {s for _, s in statuses(dest)} == {"pending"}


def test_enabling_sends_what_it_held_in_order(receiver, ops):
    # given: a destination retired by a 410 with four messages held
    dest = merchant(receiver.url, max_in_flight=1)
    for key, ordering in (("k1", "o"), ("k2", None), ("k3", "o"), ("k4", "o")):
        admit(dest, key, ordering)
    receiver.answer(410, key="k1")
    relay_destination(destination_id=dest.pk)
    assert not WebhookDestination.objects.get(pk=dest.pk).enabled

    # when: an operator enables it, and the relay runs
    with TestCase.captureOnCommitCallbacks(execute=False):
        held = destination_enable(scope=EVERY_TENANT, destination=dest, by="ops-person")
    relay_destination(destination_id=dest.pk)

    # then: all delivered, in admission order, the first one again under its key
    assert held == 4
    assert receiver.keys() == ["k1", "k1", "k2", "k3", "k4"]
    assert {s for _, s in statuses(dest)} == {"delivered"}
    dest.refresh_from_db()
    assert dest.enabled and not dest.disabled_reason and dest.disabled_at is None
    # enabling it twice changes nothing
    assert destination_enable(scope=EVERY_TENANT, destination=dest, by="ops-person") is None


def test_the_ops_destination_answering_410_is_disabled_without_a_notice_to_itself(receiver, ops):
    ops.url = receiver.url
    ops.secrets = [SECRET]
    ops.event_types = ["order.paid"]
    ops.save()
    admit(ops, "k1")
    receiver.answer(410)

    relay_destination(destination_id=ops.pk)

    ops.refresh_from_db()
    assert not ops.enabled and ops.disabled_reason == GONE_REASON
    assert statuses(ops) == [("k1", "pending")]


def _relay_at(dest, moment):
    with time_machine.travel(moment, tick=True):
        OutboxMessage.objects.filter(destination=dest, status="pending").update(
            next_attempt_at=moment
        )
        relay_destination(destination_id=dest.pk)


def test_a_long_failing_span_warns_then_disables(receiver, ops, settings):
    # given: a merchant that answers 500 to everything, spans of 4 days (warned at 1)
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "DISABLE_AFTER_FAILING_DAYS": 4,
        "DISABLE_WARNING_FRACTION": 0.25,
    }
    dest = merchant(receiver.url, max_attempts=50, breaker_threshold=50)
    admit(dest, "k1")
    start = timezone.now()
    for _ in range(4):
        receiver.answer(500)

    # when: it fails now, then half a day later
    _relay_at(dest, start)
    _relay_at(dest, start + timedelta(hours=12))
    # then: failing, neither warned nor disabled
    dest.refresh_from_db()
    assert dest.failing_since is not None and dest.failing_warned_at is None
    assert dest.enabled and notices(ops) == []

    # when: past a day
    _relay_at(dest, start + timedelta(days=1, hours=1))
    # then: warned once
    dest.refresh_from_db()
    assert dest.enabled and dest.failing_warned_at is not None
    assert [t for t, _ in notices(ops)] == ["outbox.destination_failing"]

    # when: past four days
    _relay_at(dest, start + timedelta(days=4, minutes=1))
    # then: disabled, its message held (not failed), one more notice
    dest.refresh_from_db()
    assert not dest.enabled
    assert dest.disabled_reason.startswith("no success for 4 d")
    assert statuses(dest) == [("k1", "pending")]
    assert [t for t, _ in notices(ops)] == [
        "outbox.destination_failing",
        "outbox.destination_disabled",
    ]
    assert len(receiver.received) == 4


def test_a_success_ends_the_failing_span(receiver, settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "DISABLE_AFTER_FAILING_DAYS": 2}
    dest = merchant(receiver.url, max_attempts=50, breaker_threshold=50)
    admit(dest, "k1")
    admit(dest, "k2")
    start = timezone.now()
    receiver.answer(500, key="k1")
    receiver.answer(500, key="k2")

    _relay_at(dest, start)
    dest.refresh_from_db()
    assert dest.failing_since is not None
    # a day later both succeed; then a failure three days on starts a new span
    _relay_at(dest, start + timedelta(days=1))
    dest.refresh_from_db()
    assert dest.failing_since is None and dest.enabled
    admit(dest, "k3")
    receiver.answer(500, key="k3")
    _relay_at(dest, start + timedelta(days=4))
    dest.refresh_from_db()
    assert dest.enabled and dest.failing_since is not None


def test_no_span_setting_never_disables_for_failing(receiver, settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "DISABLE_AFTER_FAILING_DAYS": 0}
    dest = merchant(receiver.url, max_attempts=50, breaker_threshold=50)
    admit(dest, "k1")
    start = timezone.now()
    receiver.answer(500)
    receiver.answer(500)
    _relay_at(dest, start)
    _relay_at(dest, start + timedelta(days=30))
    dest.refresh_from_db()
    assert dest.enabled and dest.failing_warned_at is None


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("webhook_destination", *args, stdout=out)
    return out.getvalue()


def test_the_command_disables_and_enables_and_the_held_messages_go(receiver):
    dest = merchant(receiver.url, max_in_flight=1)
    admit(dest, "k1")
    admit(dest, "k2")

    out = run_command("disable", "merchant")
    assert "disabled merchant (its messages are held until it is enabled): DISABLED" in out
    relay_destination(destination_id=dest.pk)
    assert receiver.keys() == []
    assert "DISABLED" in run_command("update", "merchant")

    with TestCase.captureOnCommitCallbacks(execute=False):
        out = run_command("update", "merchant", "--enable")
    assert "enabled merchant (2 held message(s) to send, in their order): enabled" in out
    relay_destination(destination_id=dest.pk)
    assert receiver.keys() == ["k1", "k2"]
    assert "unchanged merchant: enabled" in run_command("enable", "merchant")


def test_the_command_names_the_relays_reason(receiver):
    dest = merchant(receiver.url)
    admit(dest, "k1")
    receiver.answer(410)
    relay_destination(destination_id=dest.pk)

    assert "DISABLED by the relay (answered 410 Gone" in run_command("update", "merchant")
    with TestCase.captureOnCommitCallbacks(execute=False):
        assert "1 held message(s)" in run_command("enable", "merchant")
    assert destination_disable(scope=EVERY_TENANT, destination=dest, by="x") is True
    assert destination_disable(scope=EVERY_TENANT, destination=dest, by="x") is False
    dest.refresh_from_db()
    assert not dest.enabled and not dest.disabled_by_relay
    assert statuses(dest)[0][1] == MessageStatus.PENDING


def test_a_410_recorded_by_the_record_alone_disables_too(receiver, ops):
    # given: a round claimed and sent, its record a statement of its own (the last
    # round of a run, or SQLite's), the merchant answering 410 to one of two
    dest = merchant(receiver.url)
    admit(dest, "k1")
    admit(dest, "k2")
    receiver.answer(410, key="k2")
    round_ = relay_claim(destination=dest)

    # when
    relay_record(dest, relay_send(dest, round_.claimed))

    # then: the 2xx delivered, the 410 held, the destination disabled, one notice
    dest.refresh_from_db()
    assert not dest.enabled and dest.disabled_reason == GONE_REASON
    assert statuses(dest) == [("k1", "delivered"), ("k2", "pending")]
    assert [t for t, _ in notices(ops)] == ["outbox.destination_disabled"]
    assert relay_claim(destination=dest).claimed == []
