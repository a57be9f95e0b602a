"""Stripe: ``Stripe-Signature: t=<timestamp>,v1=<hex>`` (several ``v1`` during a secret
roll), an HMAC-SHA256 of ``{t}.{body}`` under the secret's bytes. The event id, the
default key, is in the signed body."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidSignature, MalformedSignatureHeaders
from .base import Scheme, VerifiedMessage, matching_secret, parse_timestamp, require


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


class Stripe(Scheme):
    name = "stripe"
    signature_headers = ("stripe-signature",)

    def verify(
        self, *, secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes
    ) -> VerifiedMessage:
        (raw,) = require(headers, "stripe-signature")
        timestamp: int | None = None
        presented: list[bytes] = []
        for item in raw.split(","):
            key, _, value = item.strip().partition("=")
            if key == "t":
                timestamp = parse_timestamp(value, "Stripe-Signature's t=")
            elif key == "v1":
                presented.append(value.encode("utf-8", "replace"))
        if timestamp is None or not presented:
            raise MalformedSignatureHeaders("Stripe-Signature needs t=<timestamp> and v1=<hex>.")
        expected = (_digest(secret, timestamp, body).encode() for secret in secrets)
        index = matching_secret(expected, presented)
        if index is None:
            raise InvalidSignature()
        return VerifiedMessage(
            scheme=self.name, message_id=None, timestamp=timestamp, secret_index=index
        )

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        return {"Stripe-Signature": f"t={timestamp},v1={_digest(secret, timestamp, body)}"}

    def default_key(self, *, payload: Mapping[str, Any], message: VerifiedMessage) -> Any:
        return payload.get("id")  # Stripe's event id lives in the signed body
