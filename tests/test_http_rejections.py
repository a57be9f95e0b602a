"""Every way a request is refused, through the real endpoint, and what each one leaves.

Each refused request answers its documented status and JSON body, applies nothing, and
leaves exactly one ``RequestAudit`` row describing it. The body of a request is never
stored on an audit row: only its SHA-256 and size.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import OperationalError
from django.test import override_settings

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.failing import post
from tests.settings import WEBHOOK_RECEIVER
from tests.signing import (
    event_body,
    github_headers,
    reserved,
    standard_headers,
    stripe_headers,
)
from webhook_receiver.exceptions import PayloadTooLarge
from webhook_receiver.models import FailedEvent, RequestAudit, Result, WebhookReceipt
from webhook_receiver.services import inbound
from webhook_receiver.services.inbound import read_limited_body

pytestmark = pytest.mark.django_db


def url(source: str) -> str:
    return f"/webhooks/{source}/"


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def assert_nothing_applied() -> None:
    assert not WebhookReceipt.objects.exists()
    assert not InventoryLedgerEntry.objects.exists()
    assert not OrderState.objects.exists()


def only_audit() -> RequestAudit:
    audits = list(RequestAudit.objects.all())
    assert len(audits) == 1, audits
    return audits[0]


def stale(body: bytes) -> dict[str, str]:
    return standard_headers(body, timestamp=int(time.time()) - 3600)


def early(body: bytes) -> dict[str, str]:
    return standard_headers(body, timestamp=int(time.time()) + 3600)


def without(*names: str) -> Callable[[bytes], dict[str, str]]:
    def sign(body: bytes) -> dict[str, str]:
        headers = standard_headers(body)
        for name in names:
            del headers[name]
        return headers

    return sign


def replacing(name: str, value: str) -> Callable[[bytes], dict[str, str]]:
    def sign(body: bytes) -> dict[str, str]:
        return {**standard_headers(body), name: value}

    return sign


def signed_by_stranger(body: bytes) -> dict[str, str]:
    return standard_headers(body, secret="whsec_" + "QUJD" * 8)


def inventory_body(**data: Any) -> bytes:
    return json.dumps({"type": "inventory.reserved", "data": data}).encode()


GOOD_LINES = [{"sku": "SKU-1", "quantity": 2}]


@dataclass(frozen=True)
class Case:
    status: int
    error: str
    verification: str
    body: bytes = field(default_factory=lambda: reserved("ord_1", ("SKU-1", 1)))
    sign: Callable[[bytes], dict[str, str]] = standard_headers
    source: str = "shop"
    has_detail: bool = False
    # False when the request is refused before its body is read
    body_read: bool = True
    result: str | None = None  # defaults to `error`


CASES = {
    "unknown source": Case(
        404, "unknown_source", "unknown_source", source="nowhere", body_read=False
    ),
    "missing all signature headers": Case(
        400,
        "missing_signature_headers",
        "missing_signature_headers",
        sign=lambda body: {},
        has_detail=True,
    ),
    "missing webhook-id": Case(
        400,
        "missing_signature_headers",
        "missing_signature_headers",
        sign=without("webhook-id"),
        has_detail=True,
    ),
    "missing webhook-signature": Case(
        400,
        "missing_signature_headers",
        "missing_signature_headers",
        sign=without("webhook-signature"),
        has_detail=True,
    ),
    "malformed timestamp": Case(
        400,
        "malformed_signature_headers",
        "malformed_signature_headers",
        sign=replacing("webhook-timestamp", "yesterday"),
        has_detail=True,
    ),
    "malformed signature (no v1 entry)": Case(
        400,
        "malformed_signature_headers",
        "malformed_signature_headers",
        sign=replacing("webhook-signature", "v2,c2lnbmF0dXJl"),
        has_detail=True,
    ),
    "stripe header without t": Case(
        400,
        "malformed_signature_headers",
        "malformed_signature_headers",
        source="stripe",
        sign=lambda body: {"Stripe-Signature": "v1=" + "0" * 64},
        has_detail=True,
    ),
    "github sha1 signature": Case(
        400,
        "malformed_signature_headers",
        "malformed_signature_headers",
        source="github",
        sign=lambda body: {"X-Hub-Signature-256": "sha1=" + "0" * 40},
        has_detail=True,
    ),
    "bad signature": Case(401, "invalid_signature", "invalid_signature", sign=signed_by_stranger),
    "bad base64 signature": Case(
        401,
        "invalid_signature",
        "invalid_signature",
        sign=replacing("webhook-signature", "v1,***"),
    ),
    "stripe bad signature": Case(
        401,
        "invalid_signature",
        "invalid_signature",
        source="stripe",
        sign=lambda body: stripe_headers(body, secret="whsec_someone_else"),
    ),
    "github bad signature": Case(
        401,
        "invalid_signature",
        "invalid_signature",
        source="github",
        sign=lambda body: github_headers(body, secret="not the secret"),
    ),
    "old timestamp": Case(
        401, "timestamp_out_of_tolerance", "timestamp_out_of_tolerance", sign=stale
    ),
    "future timestamp": Case(
        401, "timestamp_out_of_tolerance", "timestamp_out_of_tolerance", sign=early
    ),
    "stripe old timestamp": Case(
        401,
        "timestamp_out_of_tolerance",
        "timestamp_out_of_tolerance",
        source="stripe",
        sign=lambda body: stripe_headers(body, timestamp=int(time.time()) - 3600),
    ),
    "body too large by Content-Length": Case(
        413,
        "payload_too_large",
        "payload_too_large",
        source="small",
        body=reserved("ord_big", *[(f"SKU-{i:04d}", 1) for i in range(60)]),
        body_read=False,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_refused_request(client, case: Case):
    # given
    headers = case.sign(case.body)

    # when
    response = post(client, case.source, case.body, headers)

    # then: the documented status and JSON body
    assert response.status_code == case.status
    answer = response.json()
    assert answer["error"] == case.error
    if case.has_detail:
        assert set(answer) == {"error", "detail"}
        assert isinstance(answer["detail"], str) and answer["detail"]
    else:
        assert answer == {"error": case.error}
    assert "Retry-After" not in response.headers

    # and nothing applied
    assert_nothing_applied()

    # and exactly one audit row describing it
    audit = only_audit()
    assert audit.source == case.source
    assert audit.verification == case.verification
    assert audit.result == (case.result or case.error)
    assert audit.response_status == case.status
    assert audit.remote_addr == "127.0.0.1"
    assert audit.body_size == len(case.body)
    if case.body_read:
        assert audit.body_sha256 == sha256(case.body)
    else:
        # refused before reading: the size is the one Content-Length announced
        assert audit.body_sha256 == ""
    assert audit.event_key == "" or case.verification == "verified"
    if case.verification not in ("verified", "timestamp_out_of_tolerance"):
        # nothing from an unauthenticated request is trusted enough to be recorded
        assert audit.message_id == ""
        assert audit.signature_timestamp is None


# Signed but unprocessable: verified, so never lost. Captured as a dead letter at once
# (a permanent error) and answered 202, so the sender stops retrying.
UNPROCESSABLE = {
    "signed but not JSON": Case(
        202,
        "invalid_payload",
        "verified",
        body=b"type=inventory.reserved&order_id=ord_1",
        has_detail=True,
    ),
    "signed JSON but not an object": Case(
        202, "invalid_payload", "verified", body=b'["inventory.reserved"]', has_detail=True
    ),
    "signed JSON without type": Case(
        202,
        "invalid_payload",
        "verified",
        body=json.dumps({"data": {"order_id": "ord_1"}}).encode(),
        has_detail=True,
    ),
    "quantity 0": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(order_id="o", version=1, lines=[{"sku": "SKU-1", "quantity": 0}]),
        has_detail=True,
    ),
    "missing lines": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(order_id="o", version=1),
        has_detail=True,
    ),
    "empty lines": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(order_id="o", version=1, lines=[]),
        has_detail=True,
    ),
    "sku not a string": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(order_id="o", version=1, lines=[{"sku": 42, "quantity": 1}]),
        has_detail=True,
    ),
    "version a bool": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(order_id="o", version=True, lines=GOOD_LINES),
        has_detail=True,
    ),
    "second line invalid": Case(
        202,
        "invalid_payload",
        "verified",
        body=inventory_body(
            order_id="o", version=1, lines=[*GOOD_LINES, {"sku": "SKU-2", "quantity": -1}]
        ),
        has_detail=True,
    ),
    "order.paid without order_id": Case(
        202,
        "invalid_payload",
        "verified",
        body=event_body("order.paid", version=3),
        has_detail=True,
    ),
    "stripe event without id": Case(
        202,
        "invalid_payload",
        "verified",
        source="stripe",
        body=inventory_body(order_id="o", version=1, lines=GOOD_LINES),
        sign=stripe_headers,
        has_detail=True,
    ),
}


@pytest.mark.parametrize("case", UNPROCESSABLE.values(), ids=UNPROCESSABLE.keys())
def test_signed_but_unprocessable_is_dead_lettered(client, case: Case):
    # given
    headers = case.sign(case.body)

    # when
    response = post(client, case.source, case.body, headers)

    # then: accepted for an operator, not applied
    assert response.status_code == 202
    answer = response.json()
    assert answer["status"] == "dead_lettered"
    assert_nothing_applied()
    failed = FailedEvent.objects.get()
    assert answer == {"status": "dead_lettered", "event_key": failed.event_key}
    assert failed.status == "dead"
    assert bytes(failed.body) == case.body
    assert failed.attempts == 1
    assert failed.last_error_class == "webhook_receiver.exceptions.InvalidPayload"
    assert failed.errors[0]["kind"] == "permanent"
    assert "Traceback" in failed.errors[0]["traceback"]
    audit = only_audit()
    assert (audit.verification, audit.result, audit.response_status) == (
        "verified",
        "dead_lettered",
        202,
    )
    assert audit.event_key == failed.event_key
    assert audit.body_sha256 == sha256(case.body)


def test_missing_headers_detail_names_every_missing_header(client):
    body = reserved("ord_1", ("SKU-1", 1))

    response = post(client, "shop", body, without("webhook-timestamp", "webhook-signature")(body))

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "webhook-timestamp" in detail and "webhook-signature" in detail
    assert "webhook-id" not in detail


def test_verified_but_unprocessable_records_the_message_id(client):
    # given: an authentic delivery whose body breaks the schema
    body = inventory_body(order_id="o", version=1, lines=[{"sku": "SKU-1", "quantity": 0}])
    headers = standard_headers(body, msg_id="msg_bad_quantity")

    # when
    response = post(client, "shop", body, headers)

    # then
    assert response.json() == {"status": "dead_lettered", "event_key": "msg_bad_quantity"}
    audit = only_audit()
    assert audit.verification == "verified"
    assert audit.message_id == "msg_bad_quantity"
    assert audit.event_key == "msg_bad_quantity"
    assert int(audit.signature_timestamp.timestamp()) == int(headers["webhook-timestamp"])
    assert_nothing_applied()


def test_the_body_of_a_payload_too_large_request_is_stored_nowhere(client):
    # given: a large body with a recognisable marker
    marker = "MARKER-" + uuid.uuid4().hex
    body = json.dumps({"type": "x", "pad": marker + "x" * 2000}).encode()

    # when
    response = post(client, "small", body, standard_headers(body))

    # then
    assert response.status_code == 413
    assert not WebhookReceipt.objects.exists()
    audit = only_audit()
    stored = [str(getattr(audit, f.attname)) for f in RequestAudit._meta.concrete_fields]
    assert not any(marker in value for value in stored)
    assert audit.body_sha256 == ""
    assert audit.body_size == len(body)


def test_an_absurd_content_length_is_still_a_413(client):
    # given: a sender announcing far more than the limit
    client.raise_request_exception = False
    body = b'{"type":"x"}'

    # when
    response = post(client, "small", body, standard_headers(body), CONTENT_LENGTH=str(10**20))

    # then
    assert response.status_code == 413
    assert response.json() == {"error": "payload_too_large"}
    assert only_audit().response_status == 413


def test_a_quantity_out_of_the_column_range_is_unprocessable(client):
    # given
    client.raise_request_exception = False
    body = inventory_body(order_id="o", version=1, lines=[{"sku": "SKU-1", "quantity": 2**64}])

    # when
    response = post(client, "shop", body, standard_headers(body))

    # then: a permanent error, dead-lettered at once rather than retried forever
    assert response.status_code == 202
    assert response.json()["status"] == "dead_lettered"
    assert FailedEvent.objects.get().last_error_class.endswith("InvalidPayload")
    assert_nothing_applied()


# --- a successful delivery -------------------------------------------------------------


def test_a_successful_delivery_is_audited_and_its_receipt_keeps_the_raw_body(client):
    # given: a body with unusual spacing, plus credentials that must not be stored
    body = (
        b'{"type": "inventory.reserved",  "data": {"order_id": "ord_ok", "version": 1,\n'
        b'  "lines": [{"sku": "SKU-A", "quantity": 3}]}}'
    )
    headers = standard_headers(body, msg_id="msg_ok")
    headers.update(
        {
            "Authorization": "Bearer token-must-not-be-stored",
            "Cookie": "sessionid=cookie-must-not-be-stored",
            "X-Api-Key": "key-must-not-be-stored",
            "X-Request-Source": "tests",
        }
    )

    # when
    response = post(client, "shop", body, headers)

    # then: the answer
    assert response.status_code == 200
    assert response.json() == {"status": "applied", "event_key": "msg_ok"}
    assert WebhookReceipt.objects.get().subject == "ord_ok"

    # and the audit row
    audit = only_audit()
    assert audit.verification == "verified"
    assert audit.result == "applied"
    assert audit.response_status == 200
    assert audit.message_id == audit.event_key == "msg_ok"
    assert audit.body_sha256 == sha256(body)
    assert audit.body_size == len(body)

    # and the receipt: the body byte for byte, the headers minus credentials
    receipt = WebhookReceipt.objects.get()
    assert bytes(receipt.body) == body
    assert receipt.status == Result.APPLIED
    assert receipt.subject == "ord_ok"
    stored = {name.lower(): value for name, value in receipt.headers.items()}
    assert stored["webhook-id"] == "msg_ok"
    assert stored["webhook-signature"] == headers["webhook-signature"]
    assert stored["x-request-source"] == "tests"
    assert not {"authorization", "cookie", "x-api-key"} & set(stored)
    assert "must-not-be-stored" not in json.dumps(receipt.headers)

    # and the effect
    assert list(InventoryLedgerEntry.objects.values_list("sku", "delta", "event_key")) == [
        ("SKU-A", -3, "msg_ok")
    ]


def test_a_redelivery_is_a_duplicate_and_audited_as_one(client):
    body = reserved("ord_dup", ("SKU-1", 1))
    headers = standard_headers(body)

    first = post(client, "shop", body, headers)
    second = post(client, "shop", body, headers)

    assert first.status_code == second.status_code == 200
    assert second.json() == {
        "status": "duplicate",
        "event_key": headers["webhook-id"],
        "original": first.json(),
    }
    assert sorted(RequestAudit.objects.values_list("result", flat=True)) == [
        "applied",
        "duplicate",
    ]
    assert WebhookReceipt.objects.count() == 1
    assert InventoryLedgerEntry.objects.count() == 1


# --- the size limit is enforced while reading ------------------------------------------


class CountingStream:
    """A stream that counts the bytes handed out, optionally in small pieces."""

    def __init__(self, data: bytes, piece: int | None = None) -> None:
        self._stream = io.BytesIO(data)
        self._piece = piece
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        if self._piece is not None and (size < 0 or size > self._piece):
            size = self._piece
        chunk = self._stream.read(size)
        self.bytes_read += len(chunk)
        return chunk


def test_read_limited_body_refuses_a_body_over_the_limit_without_content_length():
    stream = CountingStream(b"x" * 2000)

    with pytest.raises(PayloadTooLarge):
        read_limited_body(stream, None, 1024)

    assert stream.bytes_read <= 1024 + 1


def test_read_limited_body_refuses_while_reading_even_if_content_length_is_small():
    # given: a Content-Length that understates the body
    stream = CountingStream(b"x" * 200_000)

    with pytest.raises(PayloadTooLarge):
        read_limited_body(stream, 10, 1024)

    assert stream.bytes_read <= 1024 + 1


def test_read_limited_body_in_small_pieces_stops_just_past_the_limit():
    stream = CountingStream(b"x" * 5000, piece=100)

    with pytest.raises(PayloadTooLarge):
        read_limited_body(stream, None, 1024)

    assert stream.bytes_read <= 1024 + 1


def test_read_limited_body_refuses_by_content_length_without_reading():
    stream = CountingStream(b"x" * 2000)

    with pytest.raises(PayloadTooLarge):
        read_limited_body(stream, 2000, 1024)

    assert stream.bytes_read == 0


@pytest.mark.parametrize("size", [0, 1, 1023, 1024])
def test_read_limited_body_accepts_up_to_the_limit(size):
    data = bytes(range(256)) * 4
    stream = CountingStream(data[:size], piece=300)

    assert read_limited_body(stream, None, 1024) == data[:size]


def test_read_limited_body_without_a_stream_is_empty():
    assert read_limited_body(None, None, 1024) == b""


# --- the database unavailable ------------------------------------------------------------


def test_database_unavailable_for_claim_and_capture_is_a_503_with_retry_after(client, monkeypatch):
    # given: the claim and the failure capture fail as with a lost database connection
    def unavailable(**kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(inbound, "event_claim_and_apply", unavailable)
    monkeypatch.setattr(inbound, "failure_capture", unavailable)
    body = reserved("ord_503", ("SKU-1", 1))
    headers = standard_headers(body, msg_id="msg_503")

    # when
    response = post(client, "shop", body, headers)

    # then
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "30"
    assert response.json()["error"] == "temporarily_unavailable"
    assert_nothing_applied()
    audit = only_audit()
    assert audit.verification == "verified"
    assert audit.response_status == 503
    assert audit.result == "OperationalError"
    assert audit.event_key == "msg_503"
    assert audit.body_sha256 == sha256(body)


def crashing_handler(event):
    raise RuntimeError("handler bug")


def test_the_audit_row_records_the_status_actually_answered_when_a_handler_crashes(client):
    # given: a handler with a bug
    client.raise_request_exception = False
    config = {**WEBHOOK_RECEIVER, "HANDLERS": {"crash.me": f"{__name__}.crashing_handler"}}
    body = event_body("crash.me", order_id="o")

    # when
    with override_settings(WEBHOOK_RECEIVER=config):
        response = post(client, "shop", body, standard_headers(body))

    # then: an unknown error counts as transient: captured for retry, answered 202
    assert response.status_code == 202
    assert response.json()["status"] == "deferred"
    audit = only_audit()
    assert audit.response_status == response.status_code
    assert audit.result == "deferred"
    assert_nothing_applied()
    failed = FailedEvent.objects.get()
    assert (failed.status, failed.last_error_class) == ("retrying", "builtins.RuntimeError")
    assert failed.next_attempt_at is not None


# --- the other schemes and a custom event key ------------------------------------------


def test_stripe_event_is_applied_under_its_id(client):
    # given
    body = json.dumps(
        {
            "id": "evt_1NxStripe",
            "object": "event",
            "type": "inventory.reserved",
            "data": {"order_id": "ord_s", "version": 1, "lines": [{"sku": "SKU-S", "quantity": 4}]},
        }
    ).encode()
    headers = stripe_headers(body)

    # when
    response = post(client, "stripe", body, headers)

    # then
    assert response.status_code == 200
    assert response.json()["status"] == "applied"
    assert response.json()["event_key"] == "evt_1NxStripe"
    receipt = WebhookReceipt.objects.get()
    assert (receipt.source, receipt.event_key, receipt.event_type) == (
        "stripe",
        "evt_1NxStripe",
        "inventory.reserved",
    )
    assert receipt.message_id == ""  # Stripe has no delivery id header
    assert list(InventoryLedgerEntry.objects.values_list("sku", "delta", "event_key")) == [
        ("SKU-S", -4, "evt_1NxStripe")
    ]
    audit = only_audit()
    assert (audit.result, audit.event_key, audit.response_status) == (
        "applied",
        "evt_1NxStripe",
        200,
    )
    assert audit.signature_timestamp is not None


def test_github_push_is_recorded_as_ignored_under_its_delivery_id(client):
    # given
    body = json.dumps({"ref": "refs/heads/main", "after": "0" * 40}).encode()
    headers = github_headers(body, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")

    # when
    response = post(client, "github", body, headers)

    # then
    assert response.status_code == 200
    assert response.json() == {
        "status": "ignored",
        "event_key": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "detail": {"event_type": "push"},
    }
    receipt = WebhookReceipt.objects.get()
    assert receipt.status == Result.IGNORED
    assert receipt.event_type == "push"
    assert receipt.event_key == receipt.message_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert receipt.signature_timestamp is None
    audit = only_audit()
    assert (audit.verification, audit.result) == ("verified", "ignored")


def test_keyed_source_treats_a_new_webhook_id_for_the_same_order_version_as_a_duplicate(client):
    # given: two deliveries of the same order/type/version under different webhook ids
    first_body = reserved("ord_k", ("SKU-K", 1), version=1)
    second_body = reserved("ord_k", ("SKU-K", 1), version=1)

    # when
    first = post(client, "keyed", first_body, standard_headers(first_body, msg_id="msg_k1"))
    second = post(client, "keyed", second_body, standard_headers(second_body, msg_id="msg_k2"))

    # then
    key = "order:ord_k:inventory.reserved:v1"
    assert first.status_code == second.status_code == 200
    assert first.json()["status"] == "applied"
    assert first.json()["event_key"] == key
    assert second.json() == {"status": "duplicate", "event_key": key, "original": first.json()}
    receipt = WebhookReceipt.objects.get()
    assert (receipt.event_key, receipt.message_id) == (key, "msg_k1")
    assert InventoryLedgerEntry.objects.count() == 1
    audits = RequestAudit.objects.order_by("id")
    assert [(a.message_id, a.event_key, a.result) for a in audits] == [
        ("msg_k1", key, "applied"),
        ("msg_k2", key, "duplicate"),
    ]


def test_keyed_source_applies_a_new_version(client):
    for version, msg_id in [(1, "msg_v1"), (2, "msg_v2")]:
        body = reserved("ord_k2", ("SKU-K", 1), version=version)
        response = post(client, "keyed", body, standard_headers(body, msg_id=msg_id))
        assert response.json()["status"] == "applied"

    assert sorted(WebhookReceipt.objects.values_list("event_key", flat=True)) == [
        "order:ord_k2:inventory.reserved:v1",
        "order:ord_k2:inventory.reserved:v2",
    ]
    assert InventoryLedgerEntry.objects.count() == 2


def test_a_late_but_authentic_request_is_audited_with_its_message_id_and_timestamp(client):
    # given: a correctly signed delivery, an hour old
    body = reserved("ord_late", ("SKU-1", 1))
    sent_at = int(time.time()) - 3600
    headers = standard_headers(body, msg_id="msg_late", timestamp=sent_at)

    # when
    response = post(client, "shop", body, headers)

    # then: refused, and the audit says which delivery it was and how late
    assert response.status_code == 401
    audit = only_audit()
    assert audit.verification == "timestamp_out_of_tolerance"
    assert audit.message_id == "msg_late"
    assert int(audit.signature_timestamp.timestamp()) == sent_at
    assert_nothing_applied()


@pytest.mark.parametrize("key", ["PURGE_BATCH_SIZE", "AUDIT_RETENTION_DAYS"])
def test_a_non_positive_retention_knob_is_a_configuration_error(key):
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, key: 0}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert key in errors[0].msg


def test_an_unknown_duplicate_check_is_a_configuration_error():
    from django.core.checks import run_checks

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "DUPLICATE_CHECK": "sometimes"}):
        errors = [e for e in run_checks() if e.id == "webhook_receiver.E001"]

    assert len(errors) == 1
    assert "DUPLICATE_CHECK" in errors[0].msg
