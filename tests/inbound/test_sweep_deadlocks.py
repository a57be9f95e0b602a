"""Two retry sweeps that hold the same orders in opposite orders: each batch is one
transaction, and an order's row stays locked by the event that moved it until the batch
commits. Applied as they were due, the two deadlocked (PostgreSQL aborted one event,
which cost a retry and a log line); applied in the order of their subjects, the second
waits for the first, and nothing deadlocks."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from project.shop.models import OrderState
from tests.support.signing import event_body
from tests.support.threads import run_together
from webhook_receiver.inbound.failures import retry_failed_events
from webhook_receiver.models import FailedEvent, FailureStatus

pytestmark = [
    pytest.mark.postgres_only("row locks held across two sessions, and a deadlock"),
    pytest.mark.django_db(transaction=True),
]

EACH = 50  # events of one order in a row, in each batch


def due_events(now) -> None:
    """Two batches' worth of due order events: the first batch moves order X then Y,
    the second Y then X (their due times put them so)."""
    plan = [("ord_X", "ord_Y"), ("ord_Y", "ord_X")]
    n = 0
    for batch, orders in enumerate(plan):
        for order in orders:
            for _ in range(EACH):
                n += 1
                key = f"evt_{batch}_{n}"
                FailedEvent.objects.create(
                    source="shop",
                    event_key=key,
                    event_type="order.paid",
                    message_id=key,
                    body=event_body("order.paid", order_id=order, version=n),
                    headers={},
                    status=FailureStatus.RETRYING,
                    attempts=1,
                    errors=[],
                    first_attempt_at=now - timedelta(hours=1),
                    last_attempt_at=now - timedelta(hours=1),
                    next_attempt_at=now - timedelta(minutes=30) + timedelta(milliseconds=n),
                )


def test_two_sweeps_over_the_same_orders_in_opposite_orders_do_not_deadlock():
    # given
    now = timezone.now()
    due_events(now)
    barrier = threading.Barrier(2)
    tried: list[int] = []

    def sweep() -> None:
        barrier.wait()
        try:
            tried.append(retry_failed_events(now=now))
        finally:
            connections.close_all()

    # when: two sweeps at once, each taking a batch of 100 (SKIP LOCKED shares them out)
    started = time.monotonic()
    batch = {**settings.WEBHOOK_RECEIVER, "SWEEP_BATCH_SIZE": 2 * EACH}
    with override_settings(WEBHOOK_RECEIVER=batch):
        run_together([threading.Thread(target=sweep) for _ in range(2)], timeout=120)
    took = time.monotonic() - started

    # then: every event applied on its first retry, none aborted by a deadlock
    failed_again = list(
        FailedEvent.objects.exclude(status=FailureStatus.RESOLVED).values_list(
            "event_key", "last_error_message"
        )
    )
    assert failed_again == [], failed_again
    assert sorted(tried) == [2 * EACH, 2 * EACH]
    assert OrderState.objects.get(order_id="ord_X").version == 4 * EACH
    assert OrderState.objects.get(order_id="ord_Y").version == 3 * EACH
    print(f"\n{4 * EACH} retries by two sweeps in {took:.2f} s, no deadlock")
