"""Every way a request is refused, through the real endpoint, and what each one leaves.

Each refused request answers its documented status and JSON body, applies nothing, and
leaves exactly one ``RequestAudit`` row describing it. The body of a request is never
stored on an audit row: only its SHA-256 and size.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable

import pytest
from django.db import OperationalError

from tests.support.http import Case, assert_nothing_applied, only_audit, post, sha256
from tests.support.signing import (
    SENDER_PUBLIC_KEY,
    github_headers,
    keyed_source,
    reserved,
    standard_headers,
    standard_v1a_headers,
    stripe_headers,
)
from webhook_receiver.exceptions import PayloadTooLarge
from webhook_receiver.inbound import receive as inbound
from webhook_receiver.inbound.receive import read_limited_body
from webhook_receiver.models import RequestAudit, WebhookReceipt

pytestmark = pytest.mark.django_db


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


def test_missing_headers_detail_names_every_missing_header(client):
    body = reserved("ord_1", ("SKU-1", 1))

    response = post(client, "shop", body, without("webhook-timestamp", "webhook-signature")(body))

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "webhook-timestamp" in detail and "webhook-signature" in detail
    assert "webhook-id" not in detail


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


def test_a_v1a_signature_by_another_key_or_for_a_source_without_public_keys_is_refused(
    client, settings
):
    keyed_source(settings, SENDER_PUBLIC_KEY)
    body = reserved("ord_1", ("SKU-1", 1))
    stranger = standard_v1a_headers(body, seed=bytes(32))

    answers = [
        post(client, "keyed", body, stranger),
        post(client, "shop", body, standard_v1a_headers(body)),  # shop has no public key
        post(client, "keyed", body + b" ", standard_v1a_headers(body)),  # a tampered body
    ]

    assert [(a.status_code, a.json()["error"]) for a in answers] == [(401, "invalid_signature")] * 3
    assert (
        list(RequestAudit.objects.values_list("verification", flat=True))
        == ["invalid_signature"] * 3
    )
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


@pytest.mark.parametrize(
    ("size", "piece", "content_length", "most_read"),
    [
        pytest.param(2000, None, None, 1024 + 1, id="over-the-limit-without-content-length"),
        # a Content-Length that understates the body is refused while reading even so
        pytest.param(200_000, None, 10, 1024 + 1, id="content-length-understated"),
        pytest.param(5000, 100, None, 1024 + 1, id="small-pieces-stop-just-past-the-limit"),
        pytest.param(2000, None, 2000, 0, id="by-content-length-without-reading"),
    ],
)
def test_read_limited_body_refuses_a_body_over_the_limit(size, piece, content_length, most_read):
    stream = CountingStream(b"x" * size, piece=piece)

    with pytest.raises(PayloadTooLarge):
        read_limited_body(stream, content_length, 1024)

    assert stream.bytes_read <= most_read


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
