"""Standard Webhooks (standardwebhooks.com): ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64>``, an HMAC-SHA256 of ``{id}.{timestamp}.{body}`` under
the base64 key after ``whsec_``.

Svix, where the specification comes from, names the same headers ``svix-id``,
``svix-timestamp`` and ``svix-signature``, and the Standard Webhooks libraries accept
both: so does this scheme, preferring the ``webhook-`` names when a request has both.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
from collections.abc import Mapping

from ..exceptions import InvalidSignature, MalformedSignatureHeaders
from .base import Scheme, VerifiedMessage, matching_secret, parse_timestamp, require


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
    except ValueError:  # binascii.Error, and non-ASCII characters (a header's latin-1)
        return b""  # an undecodable signature simply matches nothing


# "<version>,<signature>" at the start or after a space or comma; base64 holds neither
_ENTRY = re.compile(r"(?<![^\s,])(v\w*),([^\s,]*)")


def _v1_signatures(raw: str) -> list[str]:
    """The ``v1`` signatures of a header of space-separated ``<version>,<base64>``
    entries. A repeated header reaches us joined by a comma (WSGI), which this reads as
    well. Other versions (the asymmetric ``v1a``) are not ours to check."""
    return [sig for version, sig in _ENTRY.findall(raw) if version == "v1"]


def _digest(secret: str, message_id: str, timestamp: int, body: bytes) -> bytes:
    # surrogatepass: a header value is never refused for its characters, only unmatched
    signed = f"{message_id}.{timestamp}.".encode("utf-8", "surrogatepass") + body
    return hmac.new(secret_key(secret), signed, hashlib.sha256).digest()


class StandardWebhooks(Scheme):
    name = "standard"
    signature_headers = ("webhook-signature", "svix-signature")

    def verify(
        self, *, secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes
    ) -> VerifiedMessage:
        prefix = "webhook" if "webhook-id" in headers or "svix-id" not in headers else "svix"
        msg_id, raw_ts, raw_sigs = require(
            headers, f"{prefix}-id", f"{prefix}-timestamp", f"{prefix}-signature"
        )
        timestamp = parse_timestamp(raw_ts, f"{prefix}-timestamp")
        encoded = _v1_signatures(raw_sigs)
        if not encoded:
            raise MalformedSignatureHeaders(f"{prefix}-signature holds no 'v1,<base64>' entry.")
        presented = [_b64decode_or_empty(sig) for sig in encoded]
        expected = (_digest(secret, msg_id, timestamp, body) for secret in secrets)
        index = matching_secret(expected, presented)
        if index is None:
            raise InvalidSignature()
        return VerifiedMessage(
            scheme=self.name, message_id=msg_id, timestamp=timestamp, secret_index=index
        )

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
