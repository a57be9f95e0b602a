"""Hostile and unusual input through the real endpoint: every answer documented, no 5xx,
every request audited, every verified event applied once or held with its reason."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.db import DataError, IntegrityError, InternalError, OperationalError, ProgrammingError
from django.test import RequestFactory

from project.shop.models import InventoryLedgerEntry
from tests.settings import SHOP_SECRET
from tests.support.http import only_audit, post, sha256
from tests.support.signing import (
    event_body,
    github_headers,
    reserved,
    standard_headers,
    stripe_headers,
)
from webhook_receiver.core import storable
from webhook_receiver.exceptions import InvalidPayload
from webhook_receiver.inbound.failures import classify
from webhook_receiver.inbound.views import WebhookView
from webhook_receiver.models import FailedEvent, RequestAudit, WebhookReceipt
from webhook_receiver.schemes import sign

pytestmark = pytest.mark.django_db


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


# --- keys, ids and types that do not fit a column --------------------------------------


@pytest.mark.parametrize("length", [256, 300, 5000])
def test_a_message_id_longer_than_the_column_is_applied_under_its_digest(client, length):
    # given: a signed delivery whose webhook-id is longer than event_key's 255 characters
    msg_id = "m" * length
    body = reserved("ord_long", ("SKU-L", 1))

    # when: delivered, then redelivered with a fresh signature
    first = post(client, "shop", body, standard_headers(body, msg_id=msg_id))
    again = post(client, "shop", body, standard_headers(body, msg_id=msg_id))

    # then: applied once, under a key that is stable across redeliveries
    assert first.status_code == 200, first.content
    assert first.json() == {"status": "applied", "event_key": digest(msg_id)}
    assert again.json()["status"] == "duplicate"
    assert InventoryLedgerEntry.objects.filter(sku="SKU-L").count() == 1
    receipt = WebhookReceipt.objects.get()
    assert receipt.message_id == msg_id[:255]
    assert receipt.headers["Webhook-Id"] == msg_id[:8192]  # the original, kept
    assert RequestAudit.objects.filter(response_status=200).count() == 2


def test_a_long_github_delivery_id_is_recorded_under_its_digest(client):
    body = json.dumps({"zen": "Keep it logically awesome."}).encode()
    delivery = "d" * 300

    answer = post(client, "github", body, github_headers(body, delivery=delivery))

    assert answer.status_code == 200
    assert answer.json()["event_key"] == digest(delivery)
    assert WebhookReceipt.objects.get().status == "ignored"


def test_a_stripe_id_holding_nul_is_applied_under_its_digest(client):
    # given: a signed Stripe event whose id holds NUL, which no text column can store
    body = json.dumps(
        {
            "id": "evt_\u0000x",
            "type": "inventory.reserved",
            "data": {"order_id": "o_nul", "version": 1, "lines": [{"sku": "S", "quantity": 1}]},
        }
    ).encode()

    # when
    answer = post(client, "stripe", body, stripe_headers(body))
    again = post(client, "stripe", body, stripe_headers(body))

    # then
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"status": "applied", "event_key": digest("evt_\u0000x")}
    assert again.json()["status"] == "duplicate"
    assert InventoryLedgerEntry.objects.get(order_id="o_nul").delta == -1
    assert bytes(WebhookReceipt.objects.get().body) == body  # the original id, in full


def test_an_unknown_type_holding_nul_is_ignored_and_stored_escaped(client):
    body = event_body("weird\u0000type\ud800")

    answer = post(client, "shop", body, standard_headers(body, msg_id="msg_weird"))

    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "ignored"
    assert WebhookReceipt.objects.get().event_type == "weird\\x00type\\ud800"


# --- unauthenticated input never reaches a 5xx -----------------------------------------


def test_a_source_slug_holding_nul_is_a_404_and_audited(client):
    body = reserved("ord_1", ("SKU-1", 1))

    answer = client.post("/webhooks/sh%00op/", data=body, content_type="application/json")

    assert answer.status_code == 404
    assert answer.json() == {"error": "unknown_source"}
    audit = only_audit()
    assert (audit.source, audit.verification, audit.response_status) == (
        "sh\\x00op",
        "unknown_source",
        404,
    )


@pytest.mark.parametrize("scheme", ["standard", "stripe"])
def test_a_timestamp_of_4301_digits_is_a_400_and_audited(client, scheme):
    body = reserved("ord_1", ("SKU-1", 1))
    digits = "9" * 4301
    if scheme == "standard":
        headers = {**standard_headers(body), "webhook-timestamp": digits}
        source = "shop"
    else:
        headers = {"Stripe-Signature": f"t={digits},v1={'0' * 64}"}
        source = "stripe"

    answer = post(client, source, body, headers)

    assert answer.status_code == 400
    assert answer.json()["error"] == "malformed_signature_headers"
    assert only_audit().verification == "malformed_signature_headers"


@pytest.mark.parametrize("timestamp", [10**25, 999_999_999_999], ids=["10**25", "year 33658"])
def test_a_signed_absurd_timestamp_is_out_of_tolerance_and_audited(client, timestamp):
    # given: an authentic signature over a timestamp later than any datetime
    body = reserved("ord_1", ("SKU-1", 1))
    headers = sign(
        scheme="standard", secret=SHOP_SECRET, body=body, message_id="msg_far", timestamp=timestamp
    )

    answer = post(client, "shop", body, headers)

    # then: refused as late, and recorded with the time left out (no column holds it)
    assert answer.status_code == 401
    assert answer.json() == {"error": "timestamp_out_of_tolerance"}
    audit = only_audit()
    assert (audit.message_id, audit.signature_timestamp) == ("msg_far", None)
    assert audit.verification == "timestamp_out_of_tolerance"


def test_other_methods_are_refused_cheaply_and_leave_no_record(client):
    for method in ("get", "put", "delete", "patch", "options"):
        answer = getattr(client, method)("/webhooks/shop/")
        assert answer.status_code == 405, method
    assert not RequestAudit.objects.exists()


# --- verified, and can never succeed: dead-lettered at once -----------------------------


def deep_json(depth: int) -> bytes:
    return b'{"type": "inventory.reserved", "data": ' + b"[" * depth + b"]" * depth + b"}"


NEVER_SUCCEED = {
    "nested 100,000 deep": deep_json(100_000),
    "a 5,000-digit version": (
        b'{"type": "order.paid", "data": {"order_id": "o1", "version": ' + b"9" * 5000 + b"}}"
    ),
    "NUL in order_id": event_body("order.paid", order_id="o\u00001", version=1),
    "NUL in sku": reserved("ord_nul", ("SKU\u0000", 1)),
    "a lone surrogate in order_id": event_body("order.paid", order_id="o\ud800", version=1),
}


@pytest.mark.parametrize("body", NEVER_SUCCEED.values(), ids=NEVER_SUCCEED.keys())
def test_an_event_that_can_never_succeed_is_dead_lettered_at_once(client, body):
    answer = post(client, "shop", body, standard_headers(body, msg_id="msg_never"))

    assert answer.status_code == 202, answer.content
    assert answer.json() == {"status": "dead_lettered", "event_key": "msg_never"}
    failed = FailedEvent.objects.get()
    assert (failed.status, failed.attempts) == ("dead", 1)
    assert failed.errors[0]["kind"] == "permanent"
    assert bytes(failed.body) == body
    assert only_audit().result == "dead_lettered"


# --- interoperability ------------------------------------------------------------------


def test_svix_header_names_are_accepted_by_the_standard_scheme(client):
    body = reserved("ord_svix", ("SKU-S", 1))
    headers = {
        name.replace("webhook-", "svix-"): value
        for name, value in standard_headers(body, msg_id="msg_svix").items()
    }

    answer = post(client, "shop", body, headers)

    assert answer.json() == {"status": "applied", "event_key": "msg_svix"}


def test_two_signature_header_lines_joined_by_the_server_still_verify(client):
    # given: a stale signature line and a good one, joined with a comma as WSGI does
    body = reserved("ord_two", ("SKU-2", 1))
    good = standard_headers(body, msg_id="msg_two")
    stale = "v1," + "A" * 43 + "="
    good["webhook-signature"] = f"{stale},{good['webhook-signature']}"

    answer = post(client, "shop", body, good)

    assert answer.json() == {"status": "applied", "event_key": "msg_two"}


def test_two_github_signature_lines_joined_by_the_server_still_verify(client):
    body = json.dumps({"zen": "x"}).encode()
    headers = github_headers(body, delivery="gh-two")
    headers["X-Hub-Signature-256"] = f"sha256={'0' * 64},{headers['X-Hub-Signature-256']}"

    assert post(client, "github", body, headers).json()["event_key"] == "gh-two"


def test_a_chunked_body_the_server_dechunked_is_read_and_verified():
    # given: no Content-Length, and the server's mark that the input ends where it ends
    body = reserved("ord_chunked", ("SKU-C", 1))
    headers = standard_headers(body, msg_id="msg_chunked")
    request = RequestFactory().post("/webhooks/shop/", data=b"", content_type="application/json")
    request.META.pop("CONTENT_LENGTH", None)
    request.META.update({"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True})
    request.META.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})

    answer = WebhookView.as_view()(request, source="shop")

    assert answer.status_code == 200
    assert answer.data == {"status": "applied", "event_key": "msg_chunked"}
    assert only_audit().body_sha256 == sha256(body)


def test_a_chunked_body_over_the_limit_is_a_413():
    body = b"x" * 1025  # the "small" source takes 1 KiB
    request = RequestFactory().post("/webhooks/small/", data=b"", content_type="application/json")
    request.META.pop("CONTENT_LENGTH", None)
    request.META.update({"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True})

    answer = WebhookView.as_view()(request, source="small")

    assert answer.status_code == 413
    assert only_audit().verification == "payload_too_large"


def test_values_from_a_request_are_made_storable():
    assert storable.text("a\nb\x00c", 10) == "a\\x0ab\\x00"
    assert storable.key("ok") == "ok"
    assert storable.key("a\nb").startswith("sha256:")
    assert storable.moment(10**12) is None
    assert storable.headers({"X-A": "v\x00", "Cookie": "c"}, leave_out={"cookie"}) == {
        "X-A": "v\\x00"
    }


# --- classification: permanent means "fails the same way every time" -------------------


@pytest.mark.parametrize(
    "error, kind",
    [
        (InvalidPayload("bad"), "permanent"),
        (DataError("value too long"), "permanent"),
        (RecursionError("too deep"), "permanent"),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "permanent"),
        (OperationalError("deadlock detected"), "transient"),
        (InternalError("cannot execute INSERT in a read-only transaction"), "transient"),
        (IntegrityError("violates foreign key constraint"), "transient"),
        (ProgrammingError("relation does not exist"), "transient"),
        (ConnectionError("the dependency is down"), "transient"),
        (ValueError("a bug a deploy may fix"), "transient"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value,
)
def test_each_class_of_error_is_classified_by_whether_it_can_recur(error, kind):
    assert classify(error) == kind
