"""Standard Webhooks (standardwebhooks.com): ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64>``, an HMAC-SHA256 of ``{id}.{timestamp}.{body}`` under
the base64 key after ``whsec_``, or ``v1a,<base64>``, an Ed25519 signature of the same
content by a ``whsk_`` signing key, verified with its ``whpk_`` public key
(``standard_keys``). A source's secrets may mix both: a request verifies when any ``v1``
signature matches a symmetric secret or any ``v1a`` signature matches a public key.

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
from . import standard_keys
from .base import Scheme, VerifiedMessage, matching_secret, parse_timestamp, require
from .standard_keys import is_public_key, is_signing_key


# as many as a relay's destinations may sign with: past 64, a relay sending to hundreds
# of merchants decoded each secret again at every request
@functools.lru_cache(maxsize=4096)
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


def _signatures(raw: str, version: str) -> list[str]:
    """The ``version`` signatures of a header of space-separated ``<version>,<base64>``
    entries. A repeated header reaches us joined by a comma (WSGI), which this reads as
    well. Other versions are not ours to check."""
    return [sig for found, sig in _ENTRY.findall(raw) if found == version]


def _signed_content(message_id: str, timestamp: int, body: bytes) -> bytes:
    # surrogatepass: a header value is never refused for its characters, only unmatched
    return f"{message_id}.{timestamp}.".encode("utf-8", "surrogatepass") + body


def _digest(secret: str, message_id: str, timestamp: int, body: bytes) -> bytes:
    signed = _signed_content(message_id, timestamp, body)
    return hmac.new(secret_key(secret), signed, hashlib.sha256).digest()


def _asymmetric_match(public_keys: list[str], signed: bytes, presented: list[bytes]) -> bool:
    # every pair is tried, as matching_secret does: a public key is no secret, but the time
    # taken then says nothing of which signature was the good one
    matched = False
    for key in public_keys:
        for signature in presented:
            matched |= standard_keys.verify(key, signed, signature)
    return matched


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
        symmetric = [_b64decode_or_empty(sig) for sig in _signatures(raw_sigs, "v1")]
        asymmetric = [
            _b64decode_or_empty(sig) for sig in _signatures(raw_sigs, standard_keys.VERSION)
        ]
        if not symmetric and not asymmetric:
            raise MalformedSignatureHeaders(
                f"{prefix}-signature holds no 'v1,<base64>' nor 'v1a,<base64>' entry."
            )
        if len(asymmetric) > standard_keys.MAX_SIGNATURES:
            raise MalformedSignatureHeaders(
                f"{prefix}-signature holds more than {standard_keys.MAX_SIGNATURES} 'v1a' entries."
            )
        signed = _signed_content(msg_id, timestamp, body)
        # a verdict for each secret in their order (the audit names the one that
        # verified), every one computed and every pair compared, whichever matches
        index: int | None = None
        for position, secret in enumerate(secrets):
            if is_public_key(secret):
                matched = _asymmetric_match([secret], signed, asymmetric)
            elif is_signing_key(secret):
                matched = False  # a private key among a source's secrets: system check E002
            else:
                expected = [_digest(secret, msg_id, timestamp, body)]
                matched = matching_secret(expected, symmetric) is not None
            if matched and index is None:
                index = position
        if index is None:
            raise InvalidSignature()
        return VerifiedMessage(
            scheme=self.name, message_id=msg_id, timestamp=timestamp, secret_index=index
        )

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        """``v1`` with a ``whsec_`` secret, ``v1a`` with a ``whsk_`` signing key; a
        ``whpk_`` public key cannot sign (``ValueError``)."""
        if is_public_key(secret):
            raise ValueError("a whpk_ public key verifies and cannot sign: use its whsk_ key")
        if is_signing_key(secret):
            signed = _signed_content(message_id, timestamp, body)
            signature = f"{standard_keys.VERSION},{_b64(standard_keys.sign(secret, signed))}"
        else:
            signature = "v1," + _b64(_digest(secret, message_id, timestamp, body))
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature,
        }

    def secret_problem(self, secret: str) -> str | None:
        """A source's secret: a ``whsec_`` secret, or a sender's ``whpk_`` public key."""
        if is_signing_key(secret):
            return (
                "is a private signing key (whsk_): give the source the sender's public "
                "key (whpk_), and keep the signing key with the sender"
            )
        return key_problem(secret)

    def secret_bytes(self, secret: str) -> int:
        """The key material: the base64-decoded bytes after ``whsec_``, or a ``whpk_``
        public key's 32 (not a shared secret: its length is fixed); 0 when it does not
        decode (E002 says so)."""
        try:
            if is_public_key(secret):
                return len(standard_keys.public_key(secret).public_bytes_raw())
            return len(secret_key(secret))
        except ValueError:
            return 0


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def key_problem(secret: str) -> str | None:
    """Why ``secret`` is not a well-formed Standard Webhooks secret or key, or None: a
    ``whsec_`` secret, a ``whsk_`` signing key or a ``whpk_`` public key."""
    try:
        if is_signing_key(secret):
            standard_keys.signing_key(secret)
        elif is_public_key(secret):
            standard_keys.public_key(secret)
        else:
            secret_key(secret)
    except ValueError:
        if is_signing_key(secret):
            return "is not 'whsk_' + base64 of a 32-byte Ed25519 seed"
        if is_public_key(secret):
            return "is not 'whpk_' + base64 of a 32-byte Ed25519 public key"
        return "is not 'whsec_' + base64"
    return None
