"""A worker frozen mid-round, past its lease, leaves nothing half-done, on real processes:
a Celery worker of two prefork processes sends message A of an ordering key, and the
whole worker (main process and pool children) is stopped (SIGSTOP) while A's request is
in flight, for longer than A's lease (timeout + lease_margin()) and than the relay task's
soft time limit, then continued.

When it resumes, its lane records the round it had in flight as one statement (an
attempt row for A, whole), with no soft time limit firing inside it, A is delivered
once in effect, and A's siblings B and C under the same ordering key follow within
seconds, in order, not after another lease.

The round is in flight in a lane, a thread of a pool process; the worker is stopped
when it runs no task (the triggers' tasks returned): a task caught by the stop, such as
a pool process's first ``relay_destination`` importing the relay, is timed through it
by Celery, and its soft time limit fires there after the stop, whatever the lanes do."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack

import pytest
from django.db import transaction

from project.celery import app
from tests.support.outbox import destination
from tests.support.worker import start_worker, wait_for
from webhook_receiver.models import DeliveryAttempt, OutboxMessage
from webhook_receiver.outbound.admission import enqueue_webhook
from webhook_receiver.outbound.relay.round import lease_margin
from webhook_receiver.tasks import relay_destination

pytestmark = [
    pytest.mark.postgres_only("a Celery worker must see the test database"),
    pytest.mark.django_db(transaction=True),
]

TIMEOUT = 3.0  # the destination's timeout_seconds
HOLD = 2.0  # the merchant holds A's first request this long, then answers 200
LEASE = TIMEOUT + lease_margin().total_seconds()  # a claim's lease: 27 s
# the worker stays stopped past the lease, and past the relay task's soft time limit
# (60 s; stopped time counts towards it): a 60 s stop once had it fire inside a round's
# record. 65 s
FREEZE = max(LEASE, float(relay_destination.soft_time_limit or 0)) + 5.0
RESUMED_WITHIN = 5.0  # seconds from the worker's resumption to B's arrival, at most
KEYS = ["order:1:paid:v1", "order:1:shipped:v1", "order:1:closed:v1"]  # A, B, C


def runs_no_task(broker) -> bool:
    """The worker runs no task, holds none, and none is queued for it."""
    inspect = app.control.inspect(timeout=2.0, limit=1)
    active, reserved = inspect.active(), inspect.reserved()
    if active is None or reserved is None:  # no answer
        return False
    return not any([*active.values(), *reserved.values()]) and broker.llen("celery") == 0


def test_a_worker_frozen_past_its_lease_records_its_round_and_the_ordering_key_goes_on(
    broker, receiver, tmp_path
):
    a, b, c = KEYS
    # given: a worker of two processes, and a merchant that holds A's first request
    receiver.answer(200, delay=HOLD, key=a)
    dest = destination("frozen", receiver.url, timeout_seconds=TIMEOUT)
    log = tmp_path / "worker.log"
    worker = start_worker(log, concurrency=2)
    with ExitStack() as stack:
        stack.callback(worker.wait, 30)  # after the kill: callbacks run last first
        stack.callback(os.killpg, worker.pid, signal.SIGKILL)
        wait_for(lambda: " ready." in log.read_text(), 60, "the worker to start")

        # when: A, B and C of one order are admitted; A's round is in flight...
        with transaction.atomic():
            for key in KEYS:
                enqueue_webhook(dest, "order.paid", key, {"key": key}, ordering_key="order:1")
        wait_for(
            lambda: a in set(receiver.keys()) and runs_no_task(broker),
            30,
            "A's request, no task running",
        )
        # ...and the whole worker is stopped, past A's lease
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

    # nothing in the worker failed: no soft time limit, no traceback
    assert "SoftTimeLimitExceeded" not in text and "Traceback" not in text, text[-5000:]

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
    # and B within seconds of the worker's resumption, not after another lease
    assert resumed - stopped >= FREEZE
    assert first[b] - resumed < RESUMED_WITHIN, first[b] - resumed
    print(
        f"stopped {late:.3f} s after A arrived, for {resumed - stopped:.1f} s (lease "
        f"{LEASE:.0f} s); A sent {keys.count(a)}x, attempts {message.attempts}, failures "
        f"{message.failures}, its first attempt {attempts[0].duration_ms} ms; resumed -> B "
        f"{first[b] - resumed:.3f} s, B -> C {first[c] - first[b]:.3f} s"
    )
