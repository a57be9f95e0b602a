"""Signers the app did not write: the standardwebhooks library, RFC 8032's Ed25519 in
plain Python (Standard Webhooks v1a), and the published Stripe and GitHub algorithms
spelled out from their documentation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook

from tests.settings import GITHUB_SECRET, SHOP_SECRET, STRIPE_SECRET
from tests.support import ed25519_rfc8032


def standard_headers(
    body: bytes,
    *,
    msg_id: str | None = None,
    timestamp: int | None = None,
    secret: str = SHOP_SECRET,
) -> dict[str, str]:
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }


# a fixed Ed25519 seed, and its Standard Webhooks public key, for sources that verify v1a
SENDER_SEED = hashlib.sha256(b"the tests' v1a sender").digest()
SENDER_PUBLIC_KEY = "whpk_" + base64.b64encode(ed25519_rfc8032.public_key(SENDER_SEED)).decode()


def standard_v1a_headers(
    body: bytes, *, msg_id: str | None = None, seed: bytes = SENDER_SEED
) -> dict[str, str]:
    """Standard Webhooks v1a: Ed25519 over ``{id}.{timestamp}.{body}``, by RFC 8032's
    algorithm (tests/support/ed25519_rfc8032.py)."""
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time())
    signature = ed25519_rfc8032.sign(seed, f"{msg_id}.{timestamp}.".encode() + body)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1a," + base64.b64encode(signature).decode(),
    }


def keyed_source(settings, *secrets: str) -> None:
    """A Standard Webhooks source "keyed" with these secrets, beside the tests' sources."""
    sources = {
        **settings.WEBHOOK_RECEIVER["SOURCES"],
        "keyed": {"SCHEME": "standard", "SECRETS": list(secrets)},
    }
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}


def stripe_headers(
    body: bytes, *, timestamp: int | None = None, secret: str = STRIPE_SECRET
) -> dict[str, str]:
    # https://docs.stripe.com/webhooks#verify-manually: HMAC-SHA256(secret, "{t}.{payload}"), hex
    timestamp = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={timestamp},v1={mac}"}


def github_headers(
    body: bytes, *, delivery: str | None = None, secret: str = GITHUB_SECRET
) -> dict[str, str]:
    # https://docs.github.com/webhooks/using-webhooks/validating-webhook-deliveries
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Event": "push",
    }


def event_body(event_type: str, **data: Any) -> bytes:
    return json.dumps({"type": event_type, "timestamp": int(time.time()), "data": data}).encode()


def reserved(order_id: str, *lines: tuple[str, int], version: int = 1) -> bytes:
    return event_body(
        "inventory.reserved",
        order_id=order_id,
        version=version,
        lines=[{"sku": sku, "quantity": qty} for sku, qty in lines],
    )


def order_version_key(*, payload: dict[str, Any], message: Any) -> str:
    """A custom EVENT_KEY: one key per (order, event type, version)."""
    data = payload.get("data") or {}
    return f"order:{data.get('order_id')}:{payload.get('type')}:v{data.get('version')}"


def as_meta(headers: dict[str, str]) -> dict[str, str]:
    """Headers as Django test-client keyword arguments."""
    return {"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}
