"""A backlog that does not move is a state within its pickup, with real processes: no
relay at all is ``relay_not_sending`` (ALERT) once a relay would have answered; a real
relay sending at the destination's rate limit is ``behind``, never not sending.

The pickup comes from the relay's poll (RELAY_POLL_SECONDS, 1 s) and the destination's
limits (watch/pickup.py): 1 s + one token (0.5 s) + its timeout (1 s) + 15 s of slack =
17.5 s.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import transaction

from tests.support.status import status_command
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.watch.destinations import destination_statuses
from webhook_receiver.watch.statuses import DestinationStatus

pytestmark = [
    pytest.mark.postgres_only("a relay in another process must see the test database"),
    pytest.mark.django_db(transaction=True),
]

PICKUP = timedelta(seconds=17.5)


def merchant(url: str) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name="merchant",
        url=url,
        event_types=["order.paid"],
        rate_count=2,
        rate_seconds=1.0,
        burst=1,
        timeout_seconds=1.0,
    )


def admit(dest: WebhookDestination, count: int) -> None:
    with transaction.atomic():
        for n in range(count):
            enqueue_webhook(dest, "order.paid", f"order:{n}:paid", {"order": n})


def status() -> DestinationStatus:
    (only,) = destination_statuses()
    return only


def codes(s: DestinationStatus) -> list[str]:
    return [r.code for r in s.reasons]


def test_messages_due_and_no_relay_are_not_sending_within_the_pickup(receiver):
    # given: messages admitted, and no relay running to hear of them
    dest = merchant(receiver.url)
    admitted = time.monotonic()
    admit(dest, 5)
    assert status().pickup == PICKUP

    # when: the status is asked every half second until it says so
    seen: list[tuple[float, list[str]]] = []
    while time.monotonic() - admitted < PICKUP.total_seconds() + 10:
        now = status()
        seen.append((time.monotonic() - admitted, codes(now)))
        if "relay_not_sending" in codes(now):
            break
        time.sleep(0.5)

    # then: quiet within the pickup, not sending (ALERT) within a second or two after it
    said = [at for at, found in seen if "relay_not_sending" in found]
    assert said, seen
    assert PICKUP.total_seconds() < said[0] <= PICKUP.total_seconds() + 3
    assert all(found == [] for at, found in seen if at < PICKUP.total_seconds() - 1), seen
    assert receiver.keys() == []

    # and webhook_status says it, in words and in its JSON, exit 2 (ALERT)
    code, out = status_command()
    assert code == 2
    assert "1 destination in alert: merchant — relay not sending" in out
    code, document = status_command("--json")
    (reason,) = json.loads(document)["destinations"][0]["reasons"]
    assert (code, reason["code"], reason["state"]) == (2, "relay_not_sending", "alert")


def test_a_working_relay_at_its_rate_limit_is_behind_and_never_not_sending(relays, receiver):
    # given: a real relay, and 80 messages to a destination that takes 2 a second
    relays(1)
    dest = merchant(receiver.url)
    admitted = time.monotonic()
    admit(dest, 80)

    # when: the status is asked every second while the relay works through them
    seen: list[tuple[float, list[str]]] = []
    while time.monotonic() - admitted < PICKUP.total_seconds() + 12:
        seen.append((time.monotonic() - admitted, codes(status())))
        if seen[-1][1] == ["behind"] and seen[-1][0] > PICKUP.total_seconds() + 3:
            break
        time.sleep(1)

    # then: behind once the oldest has waited longer than the pickup; never not sending
    assert all("relay_not_sending" not in found for _, found in seen), seen
    assert any(found == ["behind"] for _, found in seen), seen
    delivered = OutboxMessage.objects.filter(status="delivered").count()
    assert 0 < delivered < 80
    assert len(receiver.keys()) >= delivered
