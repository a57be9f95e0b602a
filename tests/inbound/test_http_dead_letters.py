"""Signed but unprocessable requests through the real endpoint: captured, never refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from tests.settings import WEBHOOK_RECEIVER
from tests.support.http import Case, assert_nothing_applied, only_audit, post, sha256
from tests.support.signing import event_body, standard_headers, stripe_headers
from webhook_receiver.models import FailedEvent

pytestmark = pytest.mark.django_db


def inventory_body(**data: Any) -> bytes:
    return json.dumps({"type": "inventory.reserved", "data": data}).encode()


GOOD_LINES = [{"sku": "SKU-1", "quantity": 2}]


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
