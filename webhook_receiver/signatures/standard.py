"""Standard Webhooks (standardwebhooks.com): ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64>``, an HMAC-SHA256 of ``{id}.{timestamp}.{body}`` under
the base64 key after ``whsec_``."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from collections.abc import Mapping

from ..exceptions import InvalidSignature, MalformedSignatureHeaders
from .base import Scheme, VerifiedMessage, any_match, parse_timestamp, require


@functools.lru_cache(maxsize=64)
def secret_key(secret: str) -> bytes:
    """Decode a ``whsec_``-prefixed base64 secret into the HMAC key."""
    encoded = secret.removeprefix("whsec_")
    encoded += "=" * (-len(encoded) % 4)  # senders often show the secret unpadded
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise ValueError("a Standard Webhooks secret must be 'whsec_' + base64") from exc


def _b64decode_or_empty(encoded: str) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return b""  # an undecodable signature simply matches nothing


def _digest(secret: str, message_id: str, timestamp: int, body: bytes) -> bytes:
    signed = f"{message_id}.{timestamp}.".encode() + body
    return hmac.new(secret_key(secret), signed, hashlib.sha256).digest()


class StandardWebhooks(Scheme):
    name = "standard"

    def verify(
        self, *, secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes
    ) -> VerifiedMessage:
        msg_id, raw_ts, raw_sigs = require(
            headers, "webhook-id", "webhook-timestamp", "webhook-signature"
        )
        timestamp = parse_timestamp(raw_ts, "webhook-timestamp")
        # other versions (e.g. the asymmetric v1a) are not ours to check
        encoded = [
            sig
            for version, _, sig in (entry.partition(",") for entry in raw_sigs.split())
            if version == "v1"
        ]
        if not encoded:
            raise MalformedSignatureHeaders("webhook-signature holds no 'v1,<base64>' entry.")
        presented = [_b64decode_or_empty(sig) for sig in encoded]
        expected = (_digest(secret, msg_id, timestamp, body) for secret in secrets)
        if not any_match(expected, presented):
            raise InvalidSignature()
        return VerifiedMessage(scheme=self.name, message_id=msg_id, timestamp=timestamp)

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        digest = _digest(secret, message_id, timestamp, body)
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": "v1," + base64.b64encode(digest).decode(),
        }

    def secret_problem(self, secret: str) -> str | None:
        try:
            secret_key(secret)
        except ValueError:
            return "is not 'whsec_' + base64"
        return None
