"""The outbox under crashes and concurrency, with real processes: relay processes
(``manage.py webhook_relay``), a relay killed mid-delivery, answers lost on the wire,
limits held across two relays, and a stuck destination beside a healthy one.

The receiving end of the crash tests is this project's own ``shop`` endpoint (served by
``live_server``) behind a forwarding proxy: the relay's key arrives as ``webhook-id``,
which the receiver uses as the event key, so "applied once" is checked on its receipts,
its audit records and the shop's ledger.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.settings import SHOP_SECRET
from tests.support.peers import Chunks, answer_head, hostile_peer, trickled
from tests.support.proxy import (
    AfterForward,
    Forwarded,
    Proxy,
    first_answer_dropped,
    forwarding_proxy,
)
from tests.support.receiver import Receiver, running_receiver
from tests.support.worker import RelayProcess, wait_for
from webhook_receiver.models import (
    DeliveryAttempt,
    OutboxMessage,
    RequestAudit,
    WebhookDestination,
    WebhookReceipt,
)
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.outbound.relay.steps import relay_claim

RELAYS = "relay processes must see the test database"
# the relays' poll, which finds a message whose lease ran out or whose backoff ended
POLL = {"WEBHOOK_RELAY_POLL_SECONDS": "0.3"}
# seconds between a claim and its recorded start: a thread's start, a commit
SLACK = 0.1

KEY = "inventory:ord_k:reserved:v1"
# an event the shop applies: one ledger entry per line
RESERVED = {
    "type": "inventory.reserved",
    "data": {"order_id": "ord_k", "version": 1, "lines": [{"sku": "SKU-K", "quantity": 2}]},
}


# --- helpers -----------------------------------------------------------------------------


@contextmanager
def dead_end(*, listening: bool) -> Iterator[str]:
    """A loopback URL that refuses connections (a port bound but not listening), or that
    accepts them and never answers (listening, never accepted)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    if listening:
        sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hooks"
    finally:
        sock.close()


def shop_destination(url: str, **fields) -> WebhookDestination:
    """A destination whose signatures the ``shop`` source verifies."""
    return WebhookDestination.objects.create(
        name=fields.pop("name", "shop-mirror"), url=url, secrets=[SHOP_SECRET], **fields
    )


@contextmanager
def shop_behind_proxy(
    live_server, after_forward: AfterForward, **fields
) -> Iterator[tuple[Proxy, WebhookDestination]]:
    """The shop's own endpoint behind a forwarding proxy that lets ``after_forward`` choose
    the relay's answers, and a destination that sends to it."""
    with forwarding_proxy(f"{live_server.url}/webhooks/shop/", after_forward) as proxy:
        yield proxy, shop_destination(proxy.url, **fields)


def admit_reserved(dest: WebhookDestination) -> None:
    """KEY's event for the shop, committed: its admission wakes the relays."""
    with transaction.atomic():
        enqueue_webhook(dest, "inventory.reserved", KEY, RESERVED)


def admit(dest: WebhookDestination, keys: list[str], event_type: str = "order.paid") -> None:
    # committed: the admission wakes the relays
    with transaction.atomic():
        for key in keys:
            enqueue_webhook(dest, event_type, key, {"type": event_type, "data": {"key": key}})


def delivered(dest: WebhookDestination) -> int:
    return OutboxMessage.objects.filter(destination=dest, status="delivered").count()


def taken_over(
    dest: WebhookDestination, relays: Callable[..., list[RelayProcess]], what: str
) -> None:
    """The one message's lease runs out (it would after timeout + 24 s: moved to the past
    here rather than waited for), and a new relay's poll finds it and delivers it again."""
    OutboxMessage.objects.update(lease_until=timezone.now() - timedelta(seconds=1))
    replacement = relays(1, **POLL)[0]
    wait_for(lambda: delivered(dest) == 1, 30, f"{what} ({replacement.tail()})")


def applied_once(key: str) -> None:
    """The shop applied the event once: one receipt, its ledger lines once, and an
    audit trail of applied then duplicate."""
    assert WebhookReceipt.objects.filter(source="shop", event_key=key).count() == 1
    ledger = InventoryLedgerEntry.objects.filter(event_key=key)
    assert list(ledger.values_list("order_id", "sku", "delta")) == [("ord_k", "SKU-K", -2)]
    audits = RequestAudit.objects.filter(source="shop", event_key=key).order_by("received_at", "id")
    assert [(a.verification, a.result, a.response_status) for a in audits] == [
        ("verified", "applied", 200),
        ("verified", "duplicate", 200),
    ]


# --- 1. killed between claim and record ----------------------------------------------------


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
def test_a_relay_killed_after_the_receiver_committed_sends_again_and_it_applies_once(
    live_server, relays
):
    # given: the shop's own endpoint behind a proxy that, once the first request has
    # committed there, kills the relay (SIGKILL) and never answers
    running: list[RelayProcess] = []
    kill_the_relay = first_answer_dropped(before=lambda: running[0].kill())

    with shop_behind_proxy(live_server, kill_the_relay) as (proxy, dest):
        running += relays(1, **POLL)

        # when: a message is admitted; its relay run delivers, and dies before recording
        admit_reserved(dest)
        wait_for(
            lambda: proxy.dropped and running[0].process.poll() is not None,
            30,
            f"the first delivery and the kill ({running[0].tail()})",
        )

        # then: the receiver committed, but the relay recorded nothing: the message is
        # still claimed, under a lease that outlives the request's timeout by 30 s
        message = OutboxMessage.objects.get()
        assert (message.status, message.failures) == ("sending", 0)
        assert message.lease_until > timezone.now() + timedelta(seconds=25)
        assert not DeliveryAttempt.objects.exists()
        assert WebhookReceipt.objects.filter(source="shop", event_key=KEY).count() == 1

        # when: the lease runs out, and a new relay's poll finds the message again
        taken_over(dest, relays, "the redelivery")

    # then: sent twice under one key; the second answer was the receiver's duplicate
    assert proxy.keys() == [KEY, KEY]
    assert [a.status for a in proxy.answers] == [200, 200]
    assert json.loads(proxy.answers[1].body)["status"] == "duplicate"
    applied_once(KEY)
    message = OutboxMessage.objects.get()
    assert (message.status, message.last_status_code) == ("delivered", 200)
    assert message.lease_until is None
    # the killed attempt left no record of its own: the one recorded is the redelivery's
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.number, attempt.status_code) == (message.attempts, 200)


# --- 2. committed, but the answer lost on the wire -------------------------------------------


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
def test_an_answer_lost_after_the_receiver_committed_is_retried_under_the_key_and_applied_once(
    live_server, relays
):
    # given: a proxy that drops the relay's connection after the first request committed
    with shop_behind_proxy(
        live_server, first_answer_dropped(), backoff_base_seconds=60, backoff_cap_seconds=60
    ) as (proxy, dest):
        (relay,) = relays(1, **POLL)

        # when: the message is admitted and relayed once
        admit_reserved(dest)
        wait_for(
            lambda: DeliveryAttempt.objects.exists(), 30, f"the first attempt ({relay.tail()})"
        )

        # then: a connection error, recorded; the message backs off under its key
        message = OutboxMessage.objects.get()
        first = DeliveryAttempt.objects.get()
        assert (message.status, message.attempts, message.failures) == ("pending", 1, 1)
        assert message.lease_until is None
        assert first.status_code is None and "RemoteProtocolError" in first.error
        assert first.next_attempt_at == message.next_attempt_at
        assert message.next_attempt_at <= timezone.now() + timedelta(seconds=60)

        # when: it is due again (moved, rather than waited for): the relay's poll finds it
        OutboxMessage.objects.filter(pk=message.pk).update(next_attempt_at=timezone.now())
        wait_for(lambda: delivered(dest) == 1, 30, f"the retry ({relay.tail()})")

    # then: the same key twice, and the receiver applied it once
    assert proxy.keys() == [KEY, KEY]
    assert proxy.dropped == [0]
    assert json.loads(proxy.answers[1].body)["status"] == "duplicate"
    applied_once(KEY)
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts, message.failures) == ("delivered", 2, 1)
    attempts = DeliveryAttempt.objects.order_by("number")
    assert [(a.number, a.status_code) for a in attempts] == [(1, None), (2, 200)]


# --- a relay frozen past its lease -----------------------------------------------------------


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
def test_a_late_result_from_a_relay_whose_lease_ran_out_does_not_undo_the_claim_that_took_over(
    live_server, relays
):
    # given: a proxy that freezes the relay (SIGSTOP) once the first request has committed
    # and answers it 502 (a gateway that lost the answer); the second request's answer
    # waits until the frozen relay has thawed and recorded its late result
    running: list[RelayProcess] = []

    def freeze_then_thaw(number: int, answer: Forwarded) -> Forwarded | None:
        if number == 0:
            os.killpg(running[0].process.pid, signal.SIGSTOP)
            return Forwarded(502, b'{"error": "bad_gateway"}')
        os.killpg(running[0].process.pid, signal.SIGCONT)
        # the thawed relay records its 502 (attempt 1) while this one is in flight
        wait_for(DeliveryAttempt.objects.filter(number=1).exists, 15, "the late record")
        return answer

    with shop_behind_proxy(
        live_server, freeze_then_thaw, backoff_base_seconds=60, backoff_cap_seconds=60
    ) as (proxy, dest):
        running += relays(1, **POLL)
        admit_reserved(dest)
        wait_for(lambda: stopped(running[0]), 30, f"the first delivery ({running[0].tail()})")

        # when: its lease runs out (the relay frozen past it), a second relay claims the
        # message and sends it again, and the first thaws and records its 502 while the
        # second's request is in flight
        taken_over(dest, relays, "the second delivery")

    # then: the receiver applied it once, and the message is delivered: the result of
    # the claim that took over stands, whatever the late one said
    assert proxy.keys() == [KEY, KEY]
    applied_once(KEY)
    message = OutboxMessage.objects.get()
    assert (message.status, message.last_status_code) == ("delivered", 200)
    assert message.lease_until is None


def stopped(relay: RelayProcess) -> bool:
    # the third field of /proc/<pid>/stat: T when stopped by a signal
    return Path(f"/proc/{relay.process.pid}/stat").read_text().split()[2] == "T"


# --- an answer that trickles ------------------------------------------------------------------


@pytest.mark.django_db
def test_an_answer_that_trickles_is_cut_off_at_the_destination_timeout():
    # given: a destination that sends its status line, then its body a byte at a time,
    # for three times its one-second timeout
    with hostile_peer(trickles(seconds=3.0)) as peer:
        dest = WebhookDestination.objects.create(name="trickle", url=peer.url, timeout_seconds=1)
        admit(dest, ["k"])

        # when
        began = time.monotonic()
        relay_destination(destination_id=dest.pk)
        took = time.monotonic() - began

    # then: the attempt ended within its timeout (one read's worth of slack), so a lease
    # of timeout + 24 s always outlives it; and it was recorded, whatever its verdict
    assert took < dest.timeout_seconds + 1.0
    attempt = DeliveryAttempt.objects.get()
    assert attempt.duration_ms < (dest.timeout_seconds + 1.0) * 1000
    assert OutboxMessage.objects.get().status != "sending"


def trickles(*, seconds: float) -> Callable[[bytes], Chunks]:
    """A peer's script: 200 at once, then its body a byte every 0.1 s."""
    size = round(seconds / 0.1)
    return lambda request: [(0.0, answer_head(200, {}, size)), *trickled([b"."] * size, every=0.1)]


# --- 3. limits across two relay processes --------------------------------------------------


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
def test_the_concurrency_limit_holds_across_two_relays(receiver, relays):
    # given: two relays, a slow receiver, and a destination allowing two in flight
    # (the rate set high, so only the concurrency limit binds)
    dest = WebhookDestination.objects.create(
        name="slow", url=receiver.url, max_in_flight=2, rate_count=100, burst=100
    )
    for _ in range(30):
        receiver.answer(200, delay=0.3)
    pair = relays(2, LOG_LEVEL="DEBUG", **POLL)
    keys = [f"slow-{n:02}" for n in range(30)]

    # when: 30 messages commit at once; the admission wakes both relays, and each claims
    # for the destination as its answers come
    admit(dest, keys)
    wait_for(lambda: delivered(dest) == 30, 30, f"30 deliveries ({pair[0].tail()})")

    # then: never more than two requests at once, and the limit was reached
    assert receiver.most_in_flight == 2
    # every message delivered exactly once
    assert sorted(receiver.keys()) == keys
    assert DeliveryAttempt.objects.count() == 30
    assert set(DeliveryAttempt.objects.values_list("number", "status_code")) == {(1, 200)}
    # both relays ran rounds for it: the slots the first held were the second's to
    # find full (the limit lives in the database, whichever relay claims)
    for relay in pair:
        assert "outbox: a round of 1 destination:" in relay.log.read_text(), relay.tail()


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
def test_the_rate_limit_holds_across_two_relays(receiver, relays):
    # given: 5 starts a second, a burst of 5, a fast receiver, two relays
    dest = WebhookDestination.objects.create(
        name="paced", url=receiver.url, rate_count=5, rate_seconds=1, burst=5, max_in_flight=10
    )
    pair = relays(2, LOG_LEVEL="DEBUG", **POLL)
    keys = [f"paced-{n:02}" for n in range(40)]

    # when
    admit(dest, keys)
    wait_for(lambda: delivered(dest) == 40, 30, f"40 deliveries ({pair[0].tail()})")

    # then: in any span of T seconds, at most 5 + 5·T starts, on the relay's own record
    # of each start (taken after its claim, so within SLACK of the limiter's clock)...
    offset = time.time() - time.monotonic()
    started = {
        key: at.timestamp()
        for key, at in DeliveryAttempt.objects.values_list("message__key", "started_at")
    }
    arrived = {r.headers["webhook-id"]: r.at + offset for r in receiver.received}
    assert sorted(started) == sorted(arrived) == keys and len(receiver.received) == 40
    assert most_over_the_rate(started.values(), rate=5, burst=5) <= 5 * SLACK
    # ...and on the receiver's clock, within the transport's own jitter: each relay's
    # first request to a destination opens its connection after its claim, and arrives
    # late beside requests on warm connections that no limiter can hold back
    lags = [arrived[key] - started[key] for key in keys]
    jitter = max(lags) - min(lags)
    assert most_over_the_rate(arrived.values(), rate=5, burst=5) <= 5 * (jitter + SLACK)
    assert jitter < 1.0
    # and the run paced itself to the end: 35 after the burst, at 5 a second
    span = max(started.values()) - min(started.values())
    assert 35 / 5 - SLACK < span < 35 / 5 + 3
    # both relays claimed some: each took tokens the other's rounds left
    claimed = re.compile(r"outbox: a round of \d+ destinations?: [1-9]\d* claimed")
    assert all(claimed.search(relay.log.read_text()) for relay in pair)


def most_over_the_rate(starts, *, rate: float, burst: int) -> float:
    """The most starts over ``burst + rate * T`` in any window between two starts."""
    times = sorted(starts)
    return max(
        (j - i + 1) - (burst + rate * (times[j] - times[i]))
        for i in range(len(times))
        for j in range(i, len(times))
    )


@pytest.mark.django_db
def test_a_claim_with_an_older_clock_reading_does_not_move_the_bucket_back(receiver):
    # given: one start a second, a burst of one, and messages waiting
    dest = WebhookDestination.objects.create(
        name="paced", url=receiver.url, rate_count=1, rate_seconds=1, burst=1
    )
    admit(dest, ["k1", "k2", "k3"])
    now = timezone.now() + timedelta(seconds=1)

    # when: a relay claims at `now`; another, whose clock was read before it waited for
    # the destination's lock (or on a host whose clock is behind), claims at now - 0.5 s
    first = relay_claim(destination=dest, now=now)
    behind = relay_claim(destination=dest, now=now - timedelta(seconds=0.5))

    # then: the bucket's time did not move back, so 0.6 s later no token is due yet
    # (two starts in 0.6 s would exceed 1 + 1 * 0.6)
    assert [m.key for m in first.claimed] == ["k1"] and behind.claimed == []
    assert relay_claim(destination=dest, now=now + timedelta(seconds=0.6)).claimed == []
    again = relay_claim(destination=dest, now=now + timedelta(seconds=1))
    assert [m.key for m in again.claimed] == ["k2"]


# --- 4. a stuck destination beside a healthy one -------------------------------------------


@pytest.mark.postgres_only(RELAYS)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stuck", ["429", "refused", "hangs"])
def test_a_stuck_destination_does_not_delay_another(receiver, relays, stuck):
    with _stuck_url(stuck) as (url, pacing):
        # given: a relay, a stuck destination and a healthy one
        a = WebhookDestination.objects.create(
            name="stuck", url=url, timeout_seconds=5, backoff_base_seconds=60
        )
        b = WebhookDestination.objects.create(name="healthy", url=receiver.url)
        relays(1)

        # when: ten messages for the stuck one commit, then ten for the healthy one
        admit(a, [f"a-{n}" for n in range(10)])
        admit(b, [f"b-{n}" for n in range(10)])
        committed = time.monotonic()

        # then: the healthy one's ten are delivered within seconds
        wait_for(lambda: delivered(b) == 10, 10, "the healthy destination's deliveries")
        assert time.monotonic() - committed < 5
        assert sorted(receiver.keys()) == sorted(f"b-{n}" for n in range(10))

        stuck_messages = OutboxMessage.objects.filter(destination=a)
        assert not stuck_messages.filter(status="delivered").exists()
        if stuck == "429":
            # every one answered and deferred by Retry-After: 60, nothing in flight, its
            # retry budget unspent
            wait_for(lambda: len(pacing.received) == 10, 10, "the stuck destination's answers")
            wait_for(
                lambda: stuck_messages.filter(status="pending", attempts=1).count() == 10,
                10,
                "the 429s to be recorded",
            )
            assert not stuck_messages.filter(lease_until__isnull=False).exists()
            later = timezone.now() + timedelta(seconds=50)
            assert not stuck_messages.filter(next_attempt_at__lt=later).exists()
            assert set(stuck_messages.values_list("failures", flat=True)) == {0}
        elif stuck == "refused":
            # every one refused and backing off, nothing in flight; ten failures in a row
            # opened the breaker, so nothing is tried again for its cool-down
            wait_for(
                lambda: (
                    not stuck_messages.filter(attempts=0).exists()
                    and not stuck_messages.filter(status="sending").exists()
                ),
                10,
                "the refusals to be recorded",
            )
            assert set(stuck_messages.values_list("status", flat=True)) == {"pending"}
            assert not stuck_messages.filter(lease_until__isnull=False).exists()
            a.refresh_from_db()
            assert a.consecutive_failures >= a.breaker_threshold
            assert a.paused_until > timezone.now() + timedelta(seconds=50)
        else:
            # it holds no more than its own limit, requests waiting for an answer
            assert stuck_messages.filter(status="sending").count() <= a.max_in_flight


@contextmanager
def _stuck_url(stuck: str) -> Iterator[tuple[str, Receiver | None]]:
    if stuck == "429":
        with running_receiver() as pacing:
            for _ in range(20):
                pacing.answer(429, {"Retry-After": "60"})
            yield pacing.url, pacing
    else:
        with dead_end(listening=stuck == "hangs") as url:
            yield url, None
