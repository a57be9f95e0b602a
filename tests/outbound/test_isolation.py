"""No merchant can stall another, on real processes: a relay process (``manage.py
webhook_relay``), a healthy merchant, and beside it merchants that accept the connection
and never answer, or answer 503, each sent the same events with the default 10 s
timeout. Each destination is a lane of its own on the relay's loop (relay/engine.py),
so the healthy merchant receives its events as fast as it does alone."""

from __future__ import annotations

import time
from contextlib import ExitStack

import pytest
from django.db import transaction

from tests.support.outbox import destination
from tests.support.peers import answer, hostile_peer
from tests.support.worker import wait_for
from webhook_receiver.evaluation.measures import percentile
from webhook_receiver.outbound.admission import enqueue_webhook

pytestmark = [
    pytest.mark.postgres_only("a relay process must see the test database"),
    pytest.mark.django_db(transaction=True),
]

ORDERS = 40  # admitted per phase, one every EVERY seconds
EVERY = 0.15


def never_answers(request: bytes):
    yield 3600.0, b""  # holds the connection open until the test ends


def answers_503(request: bytes):
    yield 0.0, answer(503, {}, b'{"error": "busy"}')


def admit_orders(destinations, phase: str) -> dict[str, float]:
    """Admit an order event to every destination, one order every EVERY seconds;
    returns each key's admission time (monotonic, as the receiver records arrivals)."""
    admitted = {}
    for n in range(ORDERS):
        key = f"order:{phase}_{n}:paid:v1"
        with transaction.atomic():
            for dest in destinations:
                enqueue_webhook(dest, "order.paid", key, {"type": "order.paid", "n": n})
        admitted[key] = time.monotonic()
        time.sleep(EVERY)
    return admitted


def p99_of(receiver, admitted: dict[str, float]) -> float:
    wait_for(lambda: set(admitted) <= set(receiver.keys()), 60, "the healthy merchant's deliveries")
    first = {}
    for r in receiver.received:
        first.setdefault(r.headers["webhook-id"], r.at)
    value = percentile([first[key] - at for key, at in admitted.items()], 0.99)
    assert value is not None
    return value


def test_hanging_and_failing_merchants_do_not_delay_a_healthy_one(receiver, relays):
    # given: a relay and a healthy merchant
    healthy = destination("healthy", receiver.url, rate_count=50, burst=50, max_in_flight=4)
    (relay,) = relays(1)
    with ExitStack() as stack:
        # its p99 alone
        alone = p99_of(receiver, admit_orders([healthy], "alone"))

        # when: six bad merchants beside it (four never answer, two answer 503), each sent
        # the same events with the default 10 s timeout
        bad = [stack.enter_context(hostile_peer(never_answers)) for _ in range(4)]
        bad += [stack.enter_context(hostile_peer(answers_503)) for _ in range(2)]
        neighbours = [destination(f"bad-{n}", peer.url) for n, peer in enumerate(bad)]
        beside = p99_of(receiver, admit_orders([healthy, *neighbours], "beside"))

        # then: the healthy merchant's p99 is within twice (or a second more than) alone
        assert beside <= max(2 * alone, alone + 1.0), (alone, beside, relay.tail())
        # and the bad merchants were tried meanwhile: their requests were in flight
        assert all(peer.requests for peer in bad)
    print(f"healthy merchant's p99: alone {alone:.3f} s, beside six bad ones {beside:.3f} s")
