"""Accepted requests through the real endpoint: applied, ignored and duplicate deliveries."""

from __future__ import annotations

import json

import pytest

from project.shop.models import InventoryLedgerEntry
from tests.settings import SHOP_SECRET
from tests.support.http import only_audit, post, sha256
from tests.support.signing import (
    SENDER_PUBLIC_KEY,
    github_headers,
    keyed_source,
    reserved,
    standard_headers,
    standard_v1a_headers,
    stripe_headers,
)
from webhook_receiver.models import RequestAudit, Result, WebhookReceipt

pytestmark = pytest.mark.django_db


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
    # the signature verified: the record keeps that, not the signature itself
    assert stored["webhook-signature"] == "[redacted]"
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


def test_github_keyed_by_signed_body_treats_a_resend_under_a_new_delivery_id_as_a_duplicate(
    client, settings
):
    # given: a GitHub source keyed by its signed bytes, and one signed body sent twice
    # under two delivery ids (the headers GitHub does not sign)
    github = {**settings.WEBHOOK_RECEIVER["SOURCES"]["github"]}
    github["EVENT_KEY"] = "webhook_receiver.schemes.github.signed_body_key"
    sources = {**settings.WEBHOOK_RECEIVER["SOURCES"], "github": github}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}
    body = json.dumps({"ref": "refs/heads/main", "after": "1" * 40}).encode()

    # when
    first = post(client, "github", body, github_headers(body, delivery="delivery-1"))
    second = post(client, "github", body, github_headers(body, delivery="delivery-2"))
    changed = body.replace(b"1", b"2")
    third = post(client, "github", changed, github_headers(changed, delivery="delivery-1"))

    # then: the resend is a duplicate; another body is another event, whatever its id
    key = f"sha256:{sha256(body)}"
    assert first.json()["event_key"] == key
    assert second.json()["status"] == "duplicate"
    assert second.json()["event_key"] == key
    assert third.json()["event_key"] == f"sha256:{sha256(changed)}"
    assert WebhookReceipt.objects.count() == 2


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


# --- Standard Webhooks v1a ---------------------------------------------------------------


def test_a_source_given_a_public_key_applies_a_v1a_signed_delivery(client, settings):
    # given: a source verifying v1 with a shared secret and v1a with a sender's public key
    keyed_source(settings, SHOP_SECRET, SENDER_PUBLIC_KEY)
    body = reserved("ord_v1a", ("SKU-A", 2))

    # when: signed with Ed25519 (by RFC 8032's algorithm), then with the shared secret
    v1a = post(client, "keyed", body, standard_v1a_headers(body, msg_id="msg_v1a"))
    body_v1 = reserved("ord_v1", ("SKU-B", 1))
    v1 = post(client, "keyed", body_v1, standard_headers(body_v1, msg_id="msg_v1"))

    # then
    assert v1a.json() == {"status": "applied", "event_key": "msg_v1a"}
    assert v1.json() == {"status": "applied", "event_key": "msg_v1"}
    receipt = WebhookReceipt.objects.get(event_key="msg_v1a")
    stored = {name.lower(): value for name, value in receipt.headers.items()}
    assert stored["webhook-signature"] == "[redacted]"
    audit = RequestAudit.objects.get(message_id="msg_v1a")
    assert (audit.verification, audit.result) == ("verified", "applied")
