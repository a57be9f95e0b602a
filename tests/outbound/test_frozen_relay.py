"""A relay frozen mid-round, past its lease, leaves nothing half-done, on real processes:
a relay process (``manage.py webhook_relay``) sends message A of an ordering key, and is
stopped (SIGSTOP) while A's request is in flight, for longer than A's lease (timeout +
lease_margin()), then continued.

When it resumes, it records the answer it had in flight in one round (an attempt row
for A, whole), A is delivered once in effect, and A's siblings B and C under the same
ordering key follow within seconds, in order, not after another lease."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack

import pytest
from django.db import transaction

from tests.support.outbox import destination
from tests.support.worker import wait_for
from webhook_receiver.models import DeliveryAttempt, OutboxMessage
from webhook_receiver.outbound.admission import enqueue_webhook
from webhook_receiver.outbound.relay.writes import lease_margin

pytestmark = [
    pytest.mark.postgres_only("a relay process must see the test database"),
    pytest.mark.django_db(transaction=True),
]

TIMEOUT = 3.0  # the destination's timeout_seconds
HOLD = 2.0  # the merchant holds A's first request this long, then answers 200
LEASE = TIMEOUT + lease_margin().total_seconds()  # a claim's lease: 27 s
FREEZE = LEASE + 5.0  # the relay stays stopped past the lease
RESUMED_WITHIN = 5.0  # seconds from the relay's resumption to B's arrival, at most
KEYS = ["order:1:paid:v1", "order:1:shipped:v1", "order:1:closed:v1"]  # A, B, C


def test_a_relay_frozen_past_its_lease_records_its_round_and_the_ordering_key_goes_on(
    receiver, relays
):
    a, b, c = KEYS
    # given: a relay, and a merchant that holds A's first request
    receiver.answer(200, delay=HOLD, key=a)
    dest = destination("frozen", receiver.url, timeout_seconds=TIMEOUT)
    (relay,) = relays(1, WEBHOOK_RELAY_POLL_SECONDS="0.5")
    worker = relay.process
    log = relay.log
    with ExitStack():
        # when: A, B and C of one order are admitted; A's request is in flight...
        with transaction.atomic():
            for key in KEYS:
                enqueue_webhook(dest, "order.paid", key, {"key": key}, ordering_key="order:1")
        wait_for(lambda: a in set(receiver.keys()), 30, "A's request")
        # ...and the relay is stopped, past A's lease
        os.killpg(worker.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        late = stopped - receiver.received[0].at
        message = OutboxMessage.objects.get(key=a)
        in_flight = (message.status, message.attempts, DeliveryAttempt.objects.count())
        assert in_flight == ("sending", 1, 0), in_flight
        time.sleep(FREEZE)
        os.killpg(worker.pid, signal.SIGCONT)
        resumed = time.monotonic()

        # then: A, B and C delivered
        messages = OutboxMessage.objects.filter(destination=dest)
        wait_for(lambda: messages.filter(status="delivered").count() == 3, 30, "the deliveries")
        # every attempt the claims counted has its row (none left open, however late)
        wait_for(
            lambda: all(m.attempts == m.attempt_set.count() for m in messages),
            10,
            "every attempt's row",
        )
    text = log.read_text(errors="replace")

    # nothing in the relay failed: no traceback
    assert "Traceback" not in text, text[-5000:]

    # A was sent under its key every time, and delivered once in effect
    first: dict[str, float] = {}
    for r in receiver.received:
        first.setdefault(r.headers["webhook-id"], r.at)
    assert set(first) == set(KEYS)
    keys = receiver.keys()
    assert keys.count(b) == keys.count(c) == 1, keys
    assert keys.count(a) in (1, 2), keys  # twice only if A's lease was taken over
    message = OutboxMessage.objects.get(key=a)
    assert message.status == "delivered" and message.last_status_code == 200

    # every attempt of A is whole (its start, and its answer or its error), numbered 1 to
    # attempts: nothing the claims counted was left unrecorded, and nothing recorded
    # twice. The merchant answered every request 200, so an attempt beyond the first can
    # only be a claim that took over a lease that ran out, which counts as a failure
    # (queries.LEASE): failures == attempts - 1, the last attempt the delivering 200.
    attempts = list(DeliveryAttempt.objects.filter(message=message).order_by("number"))
    for attempt in attempts:
        assert attempt.started_at is not None, attempt
        assert attempt.status_code is not None or attempt.error, attempt
    assert [x.number for x in attempts] == list(range(1, message.attempts + 1))
    assert message.failures == message.attempts - 1, (message.attempts, message.failures)
    assert attempts[-1].status_code == 200

    # B and C once each, one attempt each, after A and in order
    for key in (b, c):
        sibling = OutboxMessage.objects.get(key=key)
        assert (sibling.attempts, sibling.failures) == (1, 0), key
        assert list(sibling.attempt_set.values_list("number", "status_code")) == [(1, 200)]
    assert first[a] < first[b] < first[c], first
    # and B within seconds of the relay's resumption, not after another lease
    assert resumed - stopped >= FREEZE
    assert first[b] - resumed < RESUMED_WITHIN, first[b] - resumed
    print(
        f"stopped {late:.3f} s after A arrived, for {resumed - stopped:.1f} s (lease "
        f"{LEASE:.0f} s); A sent {keys.count(a)}x, attempts {message.attempts}, failures "
        f"{message.failures}, its first attempt {attempts[0].duration_ms} ms; resumed -> B "
        f"{first[b] - resumed:.3f} s, B -> C {first[c] - first[b]:.3f} s"
    )
