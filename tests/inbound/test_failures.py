"""The failure path: capture, bounded retries, dead letters, replay and isolation."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers as test_handlers
from tests.support.http import post
from tests.support.signing import as_meta, event_body, reserved, standard_headers
from tests.support.threads import run_together
from tests.support.worker import start_worker, wait_for
from webhook_receiver.exceptions import TransientError
from webhook_receiver.inbound.failures import (
    CapturedEvent,
    failed_event_discard,
    failed_event_replay,
    failure_capture,
    purge_failed_events,
    retry_delay,
    retry_failed_events,
)
from webhook_receiver.models import FailedEvent, FailureStatus, RequestAudit, WebhookReceipt

URL = "/webhooks/shop/"
LATER = timedelta(days=1)  # past any retry delay


def receiver_settings(**overrides):
    return override_settings(WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, **overrides})


def handlers(**mapping: str) -> dict[str, dict[str, str]]:
    return {"HANDLERS": {t.replace("_", "."): path for t, path in mapping.items()}}


def crashing(failures: int, **overrides):
    """``test.crash`` raises ``failures`` times, then works; plus any other settings."""
    test_handlers.failures_left["count"] = failures
    return receiver_settings(
        **handlers(test_crash="tests.support.handlers.fails_after_writing"), **overrides
    )


def send_crash(client, key: str, order: str):
    """A ``test.crash`` event for ``order``, signed as message ``key`` and posted to shop."""
    body = event_body("test.crash", order_id=order)
    return post(client, "shop", body, standard_headers(body, msg_id=key))


def ledger_rows(event_key: str) -> int:
    return InventoryLedgerEntry.objects.filter(event_key=event_key).count()


# --- transient, then success -------------------------------------------------------


@pytest.mark.django_db
def test_a_transient_failure_then_success_applies_once_and_resolves(client):
    # given: a handler that fails once, then works
    with crashing(failures=1):
        # when: the delivery fails
        answer = send_crash(client, "msg_transient", "ord_t")

        # then: held for retry, not applied
        assert answer.status_code == 202
        assert answer.json() == {"status": "deferred", "event_key": "msg_transient"}
        failed = FailedEvent.objects.get()
        assert failed.status == FailureStatus.RETRYING
        assert failed.attempts == 1
        assert failed.next_attempt_at > failed.last_attempt_at
        assert ledger_rows("msg_transient") == 0

        # when: nothing is due yet, the sweeper leaves it alone
        assert retry_failed_events(now=failed.last_attempt_at) == 0

        # when: the retry comes due
        assert retry_failed_events(now=failed.next_attempt_at) == 1

    # then: applied once, resolved, and nothing left to retry
    failed.refresh_from_db()
    assert (failed.status, failed.resolution, failed.attempts) == ("resolved", "applied", 1)
    assert failed.next_attempt_at is None
    assert ledger_rows("msg_transient") == 1
    assert WebhookReceipt.objects.get().event_key == "msg_transient"
    assert retry_failed_events(now=timezone.now() + LATER) == 0


@pytest.mark.django_db
def test_a_retry_runs_the_stored_bytes_without_verifying_again(client):
    # given: an event signed two days ago, captured then; its timestamp is long
    # outside the tolerance, and the secret that signed it may be gone
    body = reserved("ord_old", ("SKU-OLD", 2))
    signed_at = int(time.time()) - 2 * 86400
    failure_capture(
        captured=CapturedEvent(
            source="shop",
            event_key="msg_old",
            event_type="inventory.reserved",
            message_id="msg_old",
            signature_timestamp=signed_at,
            body=body,
            headers=standard_headers(body, msg_id="msg_old", timestamp=signed_at),
        ),
        exc=TransientError("database restarting"),
    )

    # when
    tried = retry_failed_events(now=timezone.now() + LATER)

    # then
    assert tried == 1
    assert FailedEvent.objects.get().resolution == "applied"
    receipt = WebhookReceipt.objects.get()
    assert (receipt.event_key, bytes(receipt.body)) == ("msg_old", body)
    assert int(receipt.signature_timestamp.timestamp()) == signed_at


# --- permanent ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_permanent_failure_is_dead_at_once_with_everything_kept(client):
    # given: a schema violation (quantity 0), with a header that must not be stored
    body = b'{"type": "inventory.reserved", "data": {"order_id": "o", "version": 1, "lines": [{"sku": "S", "quantity": 0}]}}'  # noqa: E501
    headers = {**standard_headers(body, msg_id="msg_perm"), "Authorization": "Bearer secret"}

    # when
    answer = post(client, "shop", body, headers)

    # then
    assert answer.status_code == 202
    assert answer.json() == {"status": "dead_lettered", "event_key": "msg_perm"}
    failed = FailedEvent.objects.get()
    assert failed.status == FailureStatus.DEAD
    assert failed.next_attempt_at is None
    assert bytes(failed.body) == body
    assert failed.headers["Webhook-Id"] == "msg_perm"
    assert "Webhook-Signature" in failed.headers
    assert "Authorization" not in failed.headers
    assert int(failed.signature_timestamp.timestamp()) == int(headers["webhook-timestamp"])
    (error,) = failed.errors
    assert error["kind"] == "permanent"
    assert error["trigger"] == "delivery"
    assert error["exception"] == "webhook_receiver.exceptions.InvalidPayload"
    assert "quantity" in error["message"]
    assert "Traceback (most recent call last)" in error["traceback"]
    assert "InvalidPayload" in error["traceback"]
    assert failed.first_attempt_at == failed.last_attempt_at
    # and the sweeper never touches it
    assert retry_failed_events(now=timezone.now() + LATER) == 0


@pytest.mark.django_db
def test_an_unparsable_body_is_dead_lettered_under_its_message_id(client):
    body = b'{"type": "inventory.reserved", "data": '  # cut short

    answer = post(client, "shop", body, standard_headers(body, msg_id="msg_cut"))

    assert answer.json() == {"status": "dead_lettered", "event_key": "msg_cut"}
    failed = FailedEvent.objects.get()
    assert (failed.event_key, failed.event_type, bytes(failed.body)) == ("msg_cut", "", body)


@pytest.mark.django_db
def test_a_stripe_event_without_a_key_is_dead_lettered_under_the_body_hash(client):
    import hashlib

    from tests.support.signing import stripe_headers

    body = b'{"type": "inventory.reserved"}'  # no "id": no event key
    answer = client.post(
        "/webhooks/stripe/",
        data=body,
        content_type="application/json",
        **as_meta(stripe_headers(body)),
    )

    key = "sha256:" + hashlib.sha256(body).hexdigest()
    assert answer.json() == {"status": "dead_lettered", "event_key": key}
    assert FailedEvent.objects.get().event_key == key


# --- exhaustion, replay, duplicate ------------------------------------------------


@pytest.mark.django_db
def test_exhausted_retries_go_dead_then_replay_applies_once_and_again_is_a_duplicate(client):
    with crashing(failures=100, RETRY_MAX_ATTEMPTS=3):
        # given: three attempts, all failing
        assert send_crash(client, "msg_exhaust", "ord_x").json()["status"] == "deferred"
        for day in (1, 2):
            assert retry_failed_events(now=timezone.now() + day * LATER) == 1

        # then: dead, with the whole history
        failed = FailedEvent.objects.get()
        assert (failed.status, failed.attempts) == ("dead", 3)
        assert [e["trigger"] for e in failed.errors] == ["delivery", "retry", "retry"]
        assert all(e["kind"] == "transient" for e in failed.errors)
        assert retry_failed_events(now=timezone.now() + 3 * LATER) == 0

        # when: the cause is fixed and an operator replays it
        test_handlers.failures_left["count"] = 0
        first = failed_event_replay(failed_id=failed.pk, actor="alice")

        # then: applied once
        assert first.result == "applied"
        failed.refresh_from_db()
        assert (failed.status, failed.resolution, failed.last_replayed_by) == (
            "resolved",
            "applied",
            "alice",
        )
        assert ledger_rows("msg_exhaust") == 1

        # when: replayed again
        second = failed_event_replay(failed_id=failed.pk, actor="bob")

    # then: a duplicate; nothing applied, and the record keeps how it ended
    assert second.result == "duplicate"
    assert ledger_rows("msg_exhaust") == 1
    failed.refresh_from_db()
    assert (failed.resolution, failed.last_replayed_by) == ("applied", "bob")


@pytest.mark.django_db
def test_a_failed_replay_keeps_the_event_dead_and_records_the_error(client):
    with crashing(failures=100, RETRY_MAX_ATTEMPTS=1):
        send_crash(client, "msg_still_broken", "ord_y")
        failed = FailedEvent.objects.get()
        assert failed.status == "dead"

        result = failed_event_replay(failed_id=failed.pk, actor="carol")

    assert (result.result, result.ok) == ("failed", False)
    assert "crashed" in result.detail
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == ("dead", 2)
    assert failed.errors[-1]["trigger"] == "replay by carol"
    assert ledger_rows("msg_still_broken") == 0


@pytest.mark.django_db
def test_the_senders_redelivery_of_a_dead_key_is_processed_and_resolves_it(client):
    with crashing(failures=1, RETRY_MAX_ATTEMPTS=1):
        assert send_crash(client, "msg_redelivered", "ord_z").json()["status"] == "dead_lettered"
        answer = send_crash(client, "msg_redelivered", "ord_z")  # signed again, as resent

    assert answer.json()["status"] == "applied"
    failed = FailedEvent.objects.get()
    assert (failed.status, failed.resolution) == ("resolved", "applied")
    assert ledger_rows("msg_redelivered") == 1


@pytest.mark.django_db
def test_discard_needs_a_reason_and_records_who_and_when(client):
    body = reserved("ord_d", ("SKU", 0))  # quantity 0: dead at once
    post(client, "shop", body, standard_headers(body, msg_id="msg_discard"))
    failed = FailedEvent.objects.get()

    with pytest.raises(ValueError):
        failed_event_discard(failed_id=failed.pk, actor="dave", reason="  ")
    assert failed_event_discard(failed_id=failed.pk, actor="dave", reason="test order")
    assert not failed_event_discard(failed_id=failed.pk, actor="dave", reason="again")

    failed.refresh_from_db()
    assert (failed.status, failed.discarded_by, failed.discard_reason) == (
        "discarded",
        "dave",
        "test order",
    )
    assert failed.discarded_at is not None


# --- isolation ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.django_db
def test_one_poison_event_among_100_good_ones_blocks_none_of_them(client, seed):
    # given: 100 good reservations and two poisons, a permanent one (bad schema) and a
    # transient one (its dependency is down for good), in a random order of arrival
    good = [(f"msg_good_{i}", reserved(f"ord_{i}", ("SKU-P", 1))) for i in range(100)]
    poisons = [
        ("msg_poison_schema", reserved("ord_p1", ("SKU-P", -5))),
        ("msg_poison_down", event_body("test.poison", order_id="ord_p2")),
    ]
    arrivals = good + poisons
    random.Random(seed).shuffle(arrivals)

    with receiver_settings(
        RETRY_MAX_ATTEMPTS=3, **handlers(test_poison="tests.support.handlers.poison")
    ):
        # when
        answers = {
            key: post(client, "shop", body, standard_headers(body, msg_id=key))
            for key, body in arrivals
        }
        for day in (1, 2, 3):
            retry_failed_events(now=timezone.now() + day * LATER)

    # then: every good event applied once, the poisons held as dead letters
    assert all(answers[key].json()["status"] == "applied" for key, _ in good)
    assert InventoryLedgerEntry.objects.filter(sku="SKU-P").count() == 100
    assert WebhookReceipt.objects.count() == 100
    dead = dict(FailedEvent.objects.values_list("event_key", "status"))
    assert dead == {"msg_poison_schema": "dead", "msg_poison_down": "dead"}
    assert FailedEvent.objects.get(event_key="msg_poison_down").attempts == 3


# --- concurrency -------------------------------------------------------------------


def _capture_due(key: str, event_type: str, *, order: str | None = None) -> None:
    body = event_body(event_type, order_id=order or f"ord_{key}")
    failure_capture(
        captured=CapturedEvent(
            source="shop",
            event_key=key,
            event_type=event_type,
            message_id=key,
            signature_timestamp=int(time.time()),
            body=body,
            headers={},
        ),
        exc=TransientError("dependency down"),
    )


def _due(prefix: str, count: int, event_type: str, *, failing: Collection[int] = ()) -> list[str]:
    """``count`` captured events due for a retry, keyed ``{prefix}_0`` on; the order ids of
    those numbered in ``failing`` end in ``_fail``, which records_its_transaction fails."""
    keys = [f"{prefix}_{i}" for i in range(count)]
    for i, key in enumerate(keys):
        _capture_due(key, event_type, order=f"ord_{key}_fail" if i in failing else None)
    return keys


@contextmanager
def _recording_transactions(*, delay: float = 0.0) -> Iterator[None]:
    """``test.batch`` handled by records_its_transaction, ``delay`` seconds an event; what
    it recorded before is cleared, and its delay reset afterwards."""
    test_handlers.transactions.clear()
    test_handlers.sweep_delay["seconds"] = delay
    try:
        with receiver_settings(
            **handlers(test_batch="tests.support.handlers.records_its_transaction")
        ):
            yield
    finally:
        test_handlers.sweep_delay["seconds"] = 0.0


@pytest.mark.postgres_only("row locks taken with SKIP LOCKED")
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_at_once_never_process_the_same_event_concurrently():
    # given: 40 due events whose handler notices overlapping runs
    keys = _due("msg_sweep", 40, "test.slow")
    test_handlers.executions.clear()
    test_handlers.overlaps.clear()
    barrier = threading.Barrier(4)
    tried: list[int] = []

    def sweep() -> None:
        barrier.wait()
        try:
            tried.append(retry_failed_events(now=timezone.now() + LATER, limit=1000))
        finally:
            connections.close_all()

    # when: four sweepers start at the same instant, each locking 5 events a transaction
    slow = handlers(test_slow="tests.support.handlers.tracks_concurrency")
    with receiver_settings(**slow, SWEEP_BATCH_SIZE=5):
        run_together([threading.Thread(target=sweep) for _ in range(4)], timeout=120)

    # then: each event ran exactly once, never two at a time, and the work was shared
    assert test_handlers.overlaps == []
    assert sorted(test_handlers.executions) == sorted(keys)
    assert sum(tried) == len(keys)
    assert sum(1 for n in tried if n > 0) >= 2
    assert FailedEvent.objects.filter(status="resolved").count() == len(keys)
    assert InventoryLedgerEntry.objects.count() == len(keys)


@pytest.mark.postgres_only("txid_current() names the transaction each event ran in")
@pytest.mark.django_db(transaction=True)
def test_a_sweep_retries_a_batch_in_one_transaction_and_one_failure_spoils_none_of_it():
    # given: ten due events, three of which fail again
    keys = _due("msg_batch", 10, "test.batch", failing=(2, 5, 8))

    # when
    with _recording_transactions():
        tried = retry_failed_events(now=timezone.now() + LATER)

    # then: one transaction ran them all; the seven applied once, with their receipts,
    # and the three have their second error on record, no effect and no receipt
    assert tried == 10
    assert len({txid for _, txid in test_handlers.transactions}) == 1
    failing = {keys[2], keys[5], keys[8]}
    assert set(WebhookReceipt.objects.values_list("event_key", flat=True)) == set(keys) - failing
    assert set(InventoryLedgerEntry.objects.values_list("event_key", flat=True)) == (
        set(keys) - failing
    )
    statuses = dict(FailedEvent.objects.values_list("event_key", "status"))
    assert {k for k, s in statuses.items() if s == "resolved"} == set(keys) - failing
    for failed in FailedEvent.objects.filter(event_key__in=failing):
        assert failed.status == "retrying" and failed.attempts == 2
        assert failed.errors[-1]["exception"] == "builtins.RuntimeError"
        assert failed.next_attempt_at is not None


@pytest.mark.postgres_only("txid_current() names the transaction each event ran in")
@pytest.mark.django_db(transaction=True)
def test_slow_handlers_cut_a_sweeps_transaction_short_so_its_receipts_are_not_held_long():
    # given: eight due events whose handler takes 0.2 s each
    _due("msg_slow", 8, "test.batch")

    # when
    with _recording_transactions(delay=0.2):
        tried = retry_failed_events(now=timezone.now() + LATER, limit=8)

    # then: every event was tried in this one call, no transaction took on more than
    # half a second's worth (three at 0.2 s), and all of them applied
    per_transaction = Counter(txid for _, txid in test_handlers.transactions)
    assert tried == 8
    assert len(per_transaction) >= 3
    assert max(per_transaction.values()) <= 3
    assert FailedEvent.objects.filter(status="resolved").count() == 8
    assert InventoryLedgerEntry.objects.count() == 8


@pytest.mark.postgres_only("a Celery worker must see the test database (SQLite's is in memory)")
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_retry_still_applies_the_event_exactly_once(broker, tmp_path):
    from webhook_receiver.tasks import retry_failed_events_task

    # given: a due failed event whose handler hangs inside the claim transaction the
    # first time it runs
    _capture_due("msg_killed", "test.hang")
    FailedEvent.objects.update(next_attempt_at=timezone.now())
    marker = tmp_path / "msg_killed"
    log = tmp_path / "worker.log"
    worker = start_worker(log, tmp_path)
    try:
        # when: a real worker picks up the sweep from the real Redis broker ...
        retry_failed_events_task.delay()
        wait_for(marker.exists, 60, f"the worker to reach the handler ({log.read_text()})")
        # ... and is killed with SIGKILL while the claim transaction is open
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)

    # then: its transaction died with it, and the event is still due
    def released() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%'"
            )
            return cursor.fetchone()[0] == 0

    wait_for(released, 30, "PostgreSQL to end the killed worker's transaction")
    failed = FailedEvent.objects.get()
    assert failed.status == FailureStatus.RETRYING
    assert failed.attempts == 1
    assert ledger_rows("msg_killed") == 0
    assert not WebhookReceipt.objects.exists()

    # when: a new worker comes up and the next sweep runs
    worker = start_worker(log, tmp_path)
    try:
        retry_failed_events_task.delay()
        wait_for(
            lambda: FailedEvent.objects.filter(status=FailureStatus.RESOLVED).exists(),
            60,
            f"the retry to resolve the event ({log.read_text()})",
        )
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)

    # then: applied exactly once
    failed.refresh_from_db()
    assert (failed.status, failed.resolution) == ("resolved", "applied")
    assert ledger_rows("msg_killed") == 1
    assert WebhookReceipt.objects.filter(event_key="msg_killed").count() == 1


# --- schedule, tasks and retention ------------------------------------------------


def test_retry_delays_use_full_jitter_under_an_exponential_ceiling():
    rng = random.Random(7)
    for attempts in range(1, 12):
        ceiling = min(3600, 60 * 2 ** (attempts - 1))
        delays = [retry_delay(attempts, rng=rng).total_seconds() for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        # full jitter spreads over the whole range, not just near the ceiling
        assert min(delays) < ceiling * 0.1 and max(delays) > ceiling * 0.9


def test_the_default_schedule_spreads_eight_attempts_over_about_an_hour():
    from webhook_receiver.conf import app_settings

    config = app_settings()
    retries = range(1, config.retry_max_attempts)  # the first attempt is the delivery
    ceilings = [
        min(config.retry_max_delay, config.retry_base_delay * 2 ** (n - 1)) for n in retries
    ]
    expected_total = sum(ceilings) / 2  # full jitter's mean is half the ceiling
    assert config.retry_max_attempts == 8
    assert 45 * 60 <= expected_total <= 75 * 60


def test_tasks_are_set_for_at_least_once_work():
    from webhook_receiver import tasks

    for task in (
        tasks.retry_failed_events_task,
        tasks.purge_audit_records_task,
        tasks.purge_failed_events_task,
    ):
        assert task.acks_late and task.reject_on_worker_lost
        assert task.time_limit and task.soft_time_limit < task.time_limit
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "webhook_receiver.retry_failed_events" in names
    assert "webhook_receiver.purge_failed_events" in names


@pytest.mark.django_db
def test_retention_deletes_old_resolved_and_discarded_events_but_never_dead_ones():
    for key in ("old_resolved", "old_discarded", "old_dead", "new_resolved"):
        _capture_due(key, "test.any")
    FailedEvent.objects.filter(event_key__endswith="resolved").update(status="resolved")
    FailedEvent.objects.filter(event_key="old_discarded").update(status="discarded")
    FailedEvent.objects.filter(event_key="old_dead").update(status="dead")
    long_ago = timezone.now() - timedelta(days=400)
    FailedEvent.objects.filter(event_key__startswith="old_").update(updated_at=long_ago)

    deleted = purge_failed_events()

    assert deleted == 2
    assert sorted(FailedEvent.objects.values_list("event_key", flat=True)) == [
        "new_resolved",
        "old_dead",
    ]
    assert RequestAudit.objects.count() == 0


@pytest.mark.django_db
def test_an_event_whose_key_could_not_be_derived_is_replayed_under_its_real_key(client):
    # given: a source whose EVENT_KEY function fails once, on the first delivery
    sources = {
        **settings.WEBHOOK_RECEIVER["SOURCES"],
        "flaky": {
            "SECRETS": [settings.SHOP_SECRET],
            "EVENT_KEY": "tests.support.handlers.flaky_order_key",
        },
    }
    body = reserved("ord_k", ("SKU-K", 1))
    test_handlers.key_failures_left["count"] = 1
    with receiver_settings(SOURCES=sources):
        first = client.post(
            "/webhooks/flaky/",
            data=body,
            content_type="application/json",
            **as_meta(standard_headers(body, msg_id="msg_k1")),
        )
        # then: dead-lettered under a stand-in key (its message id), with the reason
        assert first.json() == {"status": "dead_lettered", "event_key": "msg_k1"}
        failed = FailedEvent.objects.get()
        assert failed.last_error_message == (
            "EVENT_KEY function tests.support.handlers.flaky_order_key raised KeyError: 'order_ref'"
        )

        # when: replayed after the fix, then redelivered by the sender with a new id
        replayed = failed_event_replay(failed_id=failed.pk, actor="erin")
        again = client.post(
            "/webhooks/flaky/",
            data=body,
            content_type="application/json",
            **as_meta(standard_headers(body, msg_id="msg_k2")),
        )

    # then: applied once, under the key every delivery of it derives
    assert replayed.result == "applied"
    assert WebhookReceipt.objects.get().event_key == "order:ord_k:inventory.reserved"
    assert again.json()["status"] == "duplicate"
    assert InventoryLedgerEntry.objects.filter(sku="SKU-K").count() == 1
