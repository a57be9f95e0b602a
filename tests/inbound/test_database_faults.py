"""The receive path against a real PostgreSQL that misbehaves: a table locked by another
session, a statement that runs too long, a session left read-only, a connection the
server terminates. Each time the sender gets an answer within the bound, nothing is
lost, and the app recovers with no restart."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import InternalError, connection
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.support.http import post
from tests.support.locks import table_locked
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver.core import logs
from webhook_receiver.handlers import HandlerResult, WebhookEvent
from webhook_receiver.inbound.failures import retry_failed_events
from webhook_receiver.models import FailedEvent, RequestAudit

pytestmark = [
    pytest.mark.postgres_only("the faults are PostgreSQL's: locks, timeouts, sessions"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def other_session() -> Iterator[psycopg.Connection]:
    """A second session on the test database, as another process would hold one."""
    db = connection.settings_dict
    conn = psycopg.connect(
        dbname=db["NAME"], host=db["HOST"], port=db["PORT"] or None, user=db["USER"]
    )
    yield conn
    conn.close()


@pytest.fixture
def persistent_connections(monkeypatch) -> None:
    """Connections that outlive a request and are health-checked, as in production
    (the test settings close them after every request, which would hide the faults)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 600)
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    connection.close()
    connection.ensure_connection()


@pytest.fixture
def short_bounds(settings) -> None:
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "LOCK_TIMEOUT_MS": 300,
        "STATEMENT_TIMEOUT_MS": 800,
        "HANDLERS": {"test.slow": "tests.inbound.test_database_faults.sleeps_in_the_database"},
    }


@pytest.fixture(autouse=True)
def _fresh_traceback_memory() -> Iterator[None]:
    logs.tracebacks_shown_forget()
    yield
    logs.tracebacks_shown_forget()


def sleeps_in_the_database(event: WebhookEvent) -> HandlerResult:
    """A handler whose statement takes 30 s, unless something stops it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(30)")
    return HandlerResult()


def timed_post(client, body: bytes, msg_id: str):
    started = time.monotonic()
    answer = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    return answer, time.monotonic() - started


def test_a_locked_ledger_defers_fast_and_leaves_other_events_alone(
    client, other_session, short_bounds
):
    # given: another session holds the ledger locked, as a long migration would
    other_session.execute("LOCK TABLE shop_inventoryledgerentry IN ACCESS EXCLUSIVE MODE")

    # when: a reservation (which writes the ledger) and a payment (which does not) arrive
    reserved_answer, reserved_took = timed_post(client, reserved("o_lock", ("S", 1)), "msg_lock")
    paid = event_body("order.paid", order_id="o_lock", version=1)
    paid_answer, paid_took = timed_post(client, paid, "msg_paid")

    # then: the reservation is captured for retry within the bound; the payment applies
    assert reserved_answer.json() == {"status": "deferred", "event_key": "msg_lock"}
    assert reserved_took < 5
    assert paid_answer.json()["status"] == "applied"
    assert paid_took < 1
    failed = FailedEvent.objects.get(event_key="msg_lock")
    assert "lock timeout" in failed.last_error_message

    # and once the lock is gone, the retry applies it, once
    other_session.rollback()
    assert retry_failed_events(now=timezone.now() + timezone.timedelta(days=1)) == 1
    assert InventoryLedgerEntry.objects.filter(event_key="msg_lock").count() == 1
    assert OrderState.objects.get(order_id="o_lock").version == 1


def test_a_locked_receipts_table_defers_within_the_bound(client, other_session, short_bounds):
    # given: the receipts table locked for 10 s; the claim is the delivery's first
    # statement on that table
    body = reserved("o_receipts", ("S-R", 1))

    # when
    with table_locked(other_session, "webhook_receiver_webhookreceipt", for_seconds=10):
        answer, took = timed_post(client, body, "msg_receipts")

    # then: captured for retry within the lock bound (300 ms here), not after the lock
    assert took < 3
    assert answer.json() == {"status": "deferred", "event_key": "msg_receipts"}
    failed = FailedEvent.objects.get(event_key="msg_receipts")
    assert "lock timeout" in failed.last_error_message
    assert RequestAudit.objects.get().result == "deferred"

    # and once the lock is gone, the retry applies it, once
    assert retry_failed_events(now=timezone.now() + timezone.timedelta(days=1)) == 1
    assert InventoryLedgerEntry.objects.filter(event_key="msg_receipts").count() == 1


def test_locked_receipts_and_failed_events_answer_503_within_the_bound(
    client, other_session, short_bounds
):
    # given: the receipts and the failed events both locked, for 10 s at most
    body = reserved("o_both", ("S-B", 1))
    tables = "webhook_receiver_webhookreceipt, webhook_receiver_failedevent"

    # when
    with table_locked(other_session, tables, for_seconds=10):
        answer, took = timed_post(client, body, "msg_both")

    # then: neither applied nor captured, within twice the bound: the sender retries
    assert took < 3
    assert answer.status_code == 503
    assert not FailedEvent.objects.exists()
    assert RequestAudit.objects.get().response_status == 503


def test_a_statement_that_runs_too_long_is_cancelled_and_deferred(client, short_bounds):
    answer, took = timed_post(client, event_body("test.slow"), "msg_slow")

    assert answer.json() == {"status": "deferred", "event_key": "msg_slow"}
    assert took < 5
    assert "statement timeout" in FailedEvent.objects.get().last_error_message


def test_a_session_left_read_only_is_replaced_and_the_app_heals(
    client, persistent_connections, caplog
):
    # given: the session was opened while the database was read-only (a failover), and
    # keeps that default after the database is writable again
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION default_transaction_read_only = on")
    body = reserved("o_ro", ("S-RO", 1))

    # when: the sender delivers, is answered 503, and retries
    with caplog.at_level(logging.ERROR, logger="webhook_receiver"):
        refused = post(client, "shop", body, standard_headers(body, msg_id="msg_ro"))
    retried = post(client, "shop", body, standard_headers(body, msg_id="msg_ro"))

    # then: nothing could be written the first time; the second went through a fresh
    # session, with no restart
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "30"
    assert retried.json() == {"status": "applied", "event_key": "msg_ro"}
    assert InventoryLedgerEntry.objects.filter(event_key="msg_ro").count() == 1
    assert list(RequestAudit.objects.values_list("response_status", flat=True)) == [200]
    # the 503's audit record could not be written: one log line holds its fields
    (line,) = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert "neither applied nor captured" in line.getMessage()
    assert "event_key=msg_ro" in line.getMessage()
    assert "response_status=503" in line.getMessage()


def test_a_rejection_is_answered_even_when_its_record_cannot_be_written(
    client, persistent_connections, caplog
):
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION default_transaction_read_only = on")
    body = reserved("o_ro", ("S-RO", 1))
    forged = {**standard_headers(body), "webhook-signature": "v1,AAAA"}

    with caplog.at_level(logging.ERROR, logger="webhook_receiver"):
        answer = post(client, "shop", body, forged)

    assert answer.status_code == 401  # never a 5xx for an unauthenticated request
    (line,) = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert line.getMessage().startswith("audit record not written")
    assert "verification=invalid_signature" in line.getMessage()
    # the read-only session was let go: the next request writes its record
    post(client, "shop", body, forged)
    assert RequestAudit.objects.get().verification == "invalid_signature"


def test_a_connection_the_server_terminates_loses_nothing(
    client, persistent_connections, other_session
):
    # given: the server terminates the web process's session between two requests
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other_session.execute("SELECT pg_terminate_backend(%s)", [pid])
    other_session.commit()
    body = reserved("o_term", ("S-T", 1))

    # when: the sender delivers, then delivers again (a sender's usual redelivery)
    first = post(client, "shop", body, standard_headers(body, msg_id="msg_term"))
    again = post(client, "shop", body, standard_headers(body, msg_id="msg_term"))

    # then: the claim failed on the dead session, and the event was captured on a fresh
    # one (Django reconnects after the failed rollback); the redelivery applies it once
    # and resolves the capture
    assert first.json() == {"status": "deferred", "event_key": "msg_term"}
    assert again.json() == {"status": "applied", "event_key": "msg_term"}
    assert InventoryLedgerEntry.objects.filter(event_key="msg_term").count() == 1
    captured = FailedEvent.objects.get()
    assert captured.status == "resolved"
    # deferred for the error a dead session raises, and for nothing else
    [error] = captured.errors
    assert (error["exception"], error["kind"]) == ("django.db.utils.OperationalError", "transient")
    assert error["message"].startswith(
        "consuming input failed: server closed the connection unexpectedly"
    )


def test_an_outage_logs_one_line_per_request_and_one_traceback(
    client, persistent_connections, caplog
):
    # given: a session that cannot write, met by five deliveries
    body = reserved("o_flood", ("S-F", 1))
    with caplog.at_level(logging.ERROR, logger="webhook_receiver"):
        for n in range(5):
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION default_transaction_read_only = on")
            post(client, "shop", body, standard_headers(body, msg_id=f"msg_flood_{n}"))

    # then: one line each, and only the first carries the traceback
    lines = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert len(lines) == 5
    assert [r.exc_info is not None for r in lines] == [True, False, False, False, False]
    assert all("\n" not in r.getMessage() for r in lines)


def test_a_worker_whose_session_went_read_only_reconnects_on_its_next_run(
    persistent_connections, caplog
):
    from webhook_receiver.tasks import purge_audit_records_task

    # given: the worker's session is read-only, and there is something to purge
    RequestAudit.objects.create(
        source="shop",
        verification="verified",
        response_status=200,
        received_at=timezone.now() - timezone.timedelta(days=400),
    )
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION default_transaction_read_only = on")

    # when: the task fails on it, and runs again
    with caplog.at_level(logging.ERROR):
        assert purge_audit_records_task() is None
    purged = purge_audit_records_task()

    # then: the failure was one line, naming the error a read-only session raises
    # (PostgreSQL's read_only_sql_transaction, as Django wraps it), with its traceback;
    # the second run had a fresh, writable session
    [record] = caplog.records
    assert record.getMessage().rstrip() == (
        "task purge_audit_records failed; its next run tries again: "
        'django.db.utils.InternalError: "cannot execute DELETE in a read-only transaction"'
    )
    assert record.webhook == {"error": "django.db.utils.InternalError"}
    assert record.exc_info[0] is InternalError
    assert type(record.exc_info[1].__cause__) is psycopg.errors.ReadOnlySqlTransaction
    assert purged == 1
    assert not RequestAudit.objects.exists()


def test_a_refusal_meets_a_locked_audit_table_within_the_bound(
    client, other_session, short_bounds, caplog
):
    # given: the tallies locked for 10 s at most (a migration, VACUUM FULL): a flood's
    # refusals must not each hold a worker for as long as the lock
    tables = "webhook_receiver_rejectiontally, webhook_receiver_requestaudit"
    unsigned = reserved("o_refused", ("S-X", 1))

    # when
    with table_locked(other_session, tables, for_seconds=10):
        started = time.monotonic()
        answer = post(client, "shop", unsigned, {})
        took = time.monotonic() - started

    # then: refused as always, within the lock bound (300 ms here), with a line in place
    # of the record that could not be written
    assert answer.status_code == 400
    assert took < 3
    assert not RequestAudit.objects.exists()
    [line] = [r for r in caplog.records if "audit record not written" in r.getMessage()]
    assert "lock timeout" in line.getMessage()
