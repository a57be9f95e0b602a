"""The claim-and-apply heart: duplicates, races, crashes, outcomes and the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.support import handlers as test_handlers
from tests.support.http import post
from tests.support.paths import REPO
from tests.support.signing import as_meta, event_body, reserved, standard_headers
from tests.support.threads import run_together
from webhook_receiver.handlers import HandlerResult, unregister, webhook_handler
from webhook_receiver.models import FailedEvent, RequestAudit, Result, WebhookReceipt

URL = "/webhooks/shop/"
CLAIM_CLAUSE = "ON CONFLICT (source, event_key) DO NOTHING"  # in every claim statement


def with_handler(event_type: str, path: str):
    config = {**settings.WEBHOOK_RECEIVER, "HANDLERS": {event_type: path}}
    return override_settings(WEBHOOK_RECEIVER=config)


@pytest.mark.django_db
def test_new_event_is_applied_and_its_duplicate_answers_the_stored_outcome(client):
    # given
    body = reserved("ord_1", ("SKU-A", 2), ("SKU-B", 1))
    headers = standard_headers(body, msg_id="msg_dup")

    # when
    first = post(client, "shop", body, headers)
    second = post(client, "shop", body, headers)

    # then
    assert first.status_code == 200
    assert first.json() == {"status": "applied", "event_key": "msg_dup"}
    assert second.status_code == 200
    assert second.json() == {
        "status": "duplicate",
        "event_key": "msg_dup",
        "original": first.json(),
    }
    assert list(InventoryLedgerEntry.objects.order_by("sku").values_list("sku", "delta")) == [
        ("SKU-A", -2),
        ("SKU-B", -1),
    ]
    receipt = WebhookReceipt.objects.get()
    assert (receipt.status, receipt.subject, receipt.outcome) == (
        Result.APPLIED,
        "ord_1",
        first.json(),
    )
    assert list(RequestAudit.objects.order_by("id").values_list("result", "response_status")) == [
        ("applied", 200),
        ("duplicate", 200),
    ]


@pytest.mark.django_db
def test_a_redelivery_signed_later_with_a_new_timestamp_is_still_a_duplicate(client):
    body = reserved("ord_2", ("SKU-A", 1))
    post(client, "shop", body, standard_headers(body, msg_id="msg_same"))

    again = post(client, "shop", body, standard_headers(body, msg_id="msg_same", timestamp=None))

    assert again.json()["status"] == "duplicate"
    assert InventoryLedgerEntry.objects.count() == 1


@pytest.mark.django_db
def test_released_adds_stock_back(client):
    reserve = reserved("ord_3", ("SKU-A", 3))
    release = event_body(
        "inventory.released", order_id="ord_3", version=2, lines=[{"sku": "SKU-A", "quantity": 3}]
    )
    post(client, "shop", reserve, standard_headers(reserve))
    post(client, "shop", release, standard_headers(release))

    total = InventoryLedgerEntry.objects.filter(sku="SKU-A").aggregate(total=Sum("delta"))
    assert total["total"] == 0
    assert set(InventoryLedgerEntry.objects.values_list("reason", flat=True)) == {
        "reserved",
        "released",
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("remote_addr", "stored"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
        ("fe80::1%eth0", "fe80::1"),  # a zone the inet type refuses
        ("", None),  # a server on a Unix socket
        ("unix:/run/gunicorn.sock", None),
    ],
)
def test_any_client_address_keeps_the_event_and_its_audit_record(client, remote_addr, stored):
    body = reserved("ord_addr", ("SKU-A", 1))

    answer = client.post(
        URL,
        data=body,
        content_type="application/json",
        REMOTE_ADDR=remote_addr,
        **as_meta(standard_headers(body)),
    )

    assert answer.json()["status"] == "applied"
    assert RequestAudit.objects.get().remote_addr == stored


@pytest.mark.django_db
def test_order_state_moves_forward_only_and_late_versions_are_stale(client):
    # given: version 2 arrives before version 1, then an equal version
    paid_v2 = event_body("order.paid", order_id="ord_4", version=2)
    cancelled_v1 = event_body("order.cancelled", order_id="ord_4", version=1)
    fulfilled_v2 = event_body("order.fulfilled", order_id="ord_4", version=2)

    # when
    answers = [
        post(client, "shop", b, standard_headers(b)).json()
        for b in (paid_v2, cancelled_v1, fulfilled_v2)
    ]

    # then
    assert [a["status"] for a in answers] == ["applied", "stale", "stale"]
    state = OrderState.objects.get(order_id="ord_4")
    assert (state.status, state.version) == ("paid", 2)
    assert list(WebhookReceipt.objects.order_by("id").values_list("status", flat=True)) == [
        "applied",
        "stale",
        "stale",
    ]
    # each delivery's audit record carries its own result, not the one expected up front
    audits = RequestAudit.objects.order_by("id").values_list("result", "response_status")
    assert list(audits) == [("applied", 200), ("stale", 200), ("stale", 200)]

    fulfilled_v3 = event_body("order.fulfilled", order_id="ord_4", version=3)
    assert (
        post(client, "shop", fulfilled_v3, standard_headers(fulfilled_v3)).json()["status"]
        == "applied"
    )
    state.refresh_from_db()
    assert (state.status, state.version) == ("fulfilled", 3)


@pytest.mark.django_db
def test_unknown_event_type_is_recorded_as_ignored(client):
    body = event_body("customer.updated", customer_id="c_1")

    answer = post(client, "shop", body, standard_headers(body, msg_id="msg_unknown"))

    assert answer.status_code == 200
    assert answer.json()["status"] == "ignored"
    receipt = WebhookReceipt.objects.get()
    assert (receipt.status, receipt.event_type, bytes(receipt.body)) == (
        "ignored",
        "customer.updated",
        body,
    )
    assert RequestAudit.objects.get().result == "ignored"


@pytest.mark.django_db
def test_a_handler_registered_with_the_decorator_runs_in_the_claim(client):
    calls = []

    @webhook_handler("invoice.paid")
    def invoice_paid(event):
        calls.append(event.event_key)
        return HandlerResult(subject=event.data["invoice"], detail={"seen": True})

    try:
        body = event_body("invoice.paid", invoice="inv_9")
        answer = post(client, "shop", body, standard_headers(body, msg_id="msg_inv"))
        post(client, "shop", body, standard_headers(body, msg_id="msg_inv"))
    finally:
        unregister("invoice.paid")

    assert answer.json() == {"status": "applied", "event_key": "msg_inv", "detail": {"seen": True}}
    assert calls == ["msg_inv"]
    assert WebhookReceipt.objects.get().subject == "inv_9"


@pytest.mark.django_db
def test_a_handler_named_in_settings_wins_over_one_registered_in_code(client):
    test_handlers.failures_left["count"] = 0
    body = reserved("ord_5", ("SKU-A", 1))
    with with_handler("inventory.reserved", "tests.support.handlers.fails_after_writing"):
        post(client, "shop", body, standard_headers(body))

    assert list(InventoryLedgerEntry.objects.values_list("sku", flat=True)) == ["CRASH"]


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_fails_after_writing_leaves_nothing_and_the_redelivery_applies_once(client):
    # given: a handler that writes its ledger row, then raises, once
    test_handlers.failures_left["count"] = 1
    body = event_body("test.crash", order_id="ord_crash")
    headers = standard_headers(body, msg_id="msg_crash")

    with with_handler("test.crash", "tests.support.handlers.fails_after_writing"):
        # when: the first delivery crashes
        failed = post(client, "shop", body, headers)
        # then: the claim rolled back with the ledger row; the event is held for retry
        assert failed.status_code == 202
        assert failed.json() == {"status": "deferred", "event_key": "msg_crash"}
        assert not WebhookReceipt.objects.exists()
        assert not InventoryLedgerEntry.objects.exists()
        audit = RequestAudit.objects.get()
        assert (audit.verification, audit.result, audit.response_status) == (
            "verified",
            "deferred",
            202,
        )
        assert FailedEvent.objects.get().status == "retrying"

        # when: the sender redelivers, twice
        retried = post(client, "shop", body, headers)
        again = post(client, "shop", body, headers)

    # then: applied exactly once, and the redelivery resolved the failed event
    assert retried.json()["status"] == "applied"
    failed_event = FailedEvent.objects.get()
    assert (failed_event.status, failed_event.resolution) == ("resolved", "applied")
    assert again.json()["status"] == "duplicate"
    assert InventoryLedgerEntry.objects.filter(event_key="msg_crash").count() == 1
    assert WebhookReceipt.objects.filter(event_key="msg_crash").count() == 1


@pytest.mark.postgres_only("another process must see the test database (SQLite's is in memory)")
@pytest.mark.django_db(transaction=True)
def test_a_process_killed_mid_transaction_leaves_nothing_and_the_redelivery_applies_once(client):
    # given: another process runs the service with a handler that SIGKILLs it after
    # its ledger write, inside the open claim transaction
    body = event_body("test.kill", order_id="ord_kill")
    headers = standard_headers(body, msg_id="msg_kill")
    db = connection.settings_dict
    script = f"""
import django, io, json
django.setup()
from django.test import override_settings
from django.conf import settings
from webhook_receiver.inbound.receive import webhook_receive
handlers = {{"test.kill": "tests.support.handlers.killed_after_writing"}}
config = {{**settings.WEBHOOK_RECEIVER, "HANDLERS": handlers}}
body = {body!r}
with override_settings(WEBHOOK_RECEIVER=config):
    webhook_receive(source_slug="shop", stream=io.BytesIO(body), content_length=len(body),
                    headers={json.dumps(headers)})
"""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }

    # when
    crashed = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, timeout=60)

    # then: the process died by SIGKILL and its transaction left no trace
    assert crashed.returncode == -9
    assert not WebhookReceipt.objects.exists()
    assert not InventoryLedgerEntry.objects.exists()

    # when: the sender redelivers to a healthy handler
    with with_handler("test.kill", "tests.support.handlers.fails_after_writing"):
        test_handlers.failures_left["count"] = 0
        answer = post(client, "shop", body, headers)

    # then
    assert answer.json()["status"] == "applied"
    assert InventoryLedgerEntry.objects.filter(event_key="msg_kill").count() == 1


def _deliver_concurrently(url: str, body: bytes, headers: dict[str, str], senders: int):
    barrier = threading.Barrier(senders)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def send() -> None:
        request = urllib.request.Request(
            url, data=body, headers={**headers, "Content-Type": "application/json"}, method="POST"
        )
        barrier.wait()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                result = (response.status, json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            result = (exc.code, json.loads(exc.read() or b"{}"))
        with lock:
            answers.append(result)

    run_together([threading.Thread(target=send) for _ in range(senders)], timeout=120)
    return answers


@pytest.mark.postgres_only("row-level concurrency, where SQLite serialises writers")
@pytest.mark.django_db(transaction=True)
def test_32_concurrent_deliveries_of_one_new_event_apply_it_once(threaded_server):
    # given
    senders = 32
    body = reserved("ord_race", ("SKU-RACE", 5), ("SKU-RACE-2", 1))
    headers = standard_headers(body, msg_id="msg_race")

    # when: 32 threads send the same new event at once to a threaded server
    answers = _deliver_concurrently(threaded_server + URL, body, headers, senders)

    # then: every answer is 200, exactly one applied, and one effect in the ledger
    assert len(answers) == senders
    assert {status for status, _ in answers} == {200}
    statuses = sorted(answer["status"] for _, answer in answers)
    assert statuses.count("applied") == 1
    assert statuses.count("duplicate") == senders - 1
    assert WebhookReceipt.objects.filter(event_key="msg_race").count() == 1
    assert list(InventoryLedgerEntry.objects.order_by("sku").values_list("sku", "delta")) == [
        ("SKU-RACE", -5),
        ("SKU-RACE-2", -1),
    ]
    assert RequestAudit.objects.filter(event_key="msg_race").count() == senders
    assert RequestAudit.objects.filter(event_key="msg_race", result="duplicate").count() == (
        senders - 1
    )
    # every loser answers with the winner's stored outcome, even when it lost the race
    # inside its own statement and had to read that outcome again
    applied = next(answer for _, answer in answers if answer["status"] == "applied")
    originals = [answer["original"] for _, answer in answers if answer["status"] == "duplicate"]
    assert originals == [applied] * (senders - 1)


@pytest.mark.postgres_only("row-level concurrency, where SQLite serialises writers")
@pytest.mark.django_db(transaction=True)
def test_concurrent_versions_of_one_order_converge_on_the_highest(threaded_server):
    # given: versions 1..32 of one order, all sent at once
    bodies = [event_body("order.paid", order_id="ord_versions", version=v) for v in range(1, 33)]
    barrier = threading.Barrier(len(bodies))
    statuses: list[int] = []

    def send(body: bytes) -> None:
        request = urllib.request.Request(
            threaded_server + URL,
            data=body,
            headers={**standard_headers(body), "Content-Type": "application/json"},
            method="POST",
        )
        barrier.wait()
        with urllib.request.urlopen(request, timeout=60) as response:
            statuses.append(response.status)

    run_together([threading.Thread(target=send, args=(b,)) for b in bodies], timeout=120)

    # then
    assert statuses == [200] * 32
    state = OrderState.objects.get(order_id="ord_versions")
    assert state.version == 32
    assert WebhookReceipt.objects.count() == 32


# --- a redelivery storm: every duplicate is answered by the claim -----------------------


@pytest.mark.django_db
def test_a_storm_of_duplicates_is_answered_by_the_claim_one_statement_each(client):
    bodies = [reserved(f"ord_st{i}", ("SKU-A", 1)) for i in range(40)]
    ids = [f"msg_storm_{i}" for i in range(40)]

    def deliver_all() -> list[str]:
        return [
            post(client, "shop", body, standard_headers(body, msg_id=msg_id)).json()["status"]
            for body, msg_id in zip(bodies, ids, strict=True)
        ]

    assert deliver_all() == ["applied"] * 40

    # when: a sender replays them all (duplicates are every request, not a share of them)
    with CaptureQueriesContext(connection) as captured:
        assert deliver_all() == ["duplicate"] * 40

    # then: one path, the claim, for each of them; every request left its record, and
    # nothing applied twice
    claims = sum(CLAIM_CLAUSE in query["sql"] for query in captured.captured_queries)
    assert claims == 40
    assert InventoryLedgerEntry.objects.count() == 40
    assert RequestAudit.objects.filter(result="applied").count() == 40
    assert RequestAudit.objects.filter(result="duplicate").count() == 40
