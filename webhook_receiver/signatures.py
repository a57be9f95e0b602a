"""Signature verification: pure functions over the raw request bytes.

``verify()`` takes the configured secrets, the request headers and the body exactly as
received, and returns a ``VerifiedMessage`` or raises a ``RejectedRequest`` subclass. It
never parses the body and never touches the database.

Every configured secret is compared with every presented signature, using
``hmac.compare_digest`` and without stopping at the first match, so timing reveals
neither which secret nor which signature matched. The signature is checked before the
timestamp: a ``timestamp_out_of_tolerance`` therefore always means an authentic but
stale (or early) request, which is worth knowing when reading the audit trail.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .exceptions import (
    InvalidSignature,
    MalformedSignatureHeaders,
    MissingSignatureHeaders,
    TimestampOutOfTolerance,
)


@dataclass(frozen=True)
class VerifiedMessage:
    scheme: str
    message_id: str | None  # the scheme's delivery id, when it has one
    timestamp: int | None  # signature timestamp (Unix seconds), when the scheme signs one


def verify(
    *,
    scheme: str,
    secrets: Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    tolerance_seconds: int,
    now: float | None = None,
) -> VerifiedMessage:
    lowered = {name.lower(): value for name, value in headers.items()}
    verifier = _VERIFIERS[scheme]
    message = verifier(tuple(secrets), lowered, body)
    now = time.time() if now is None else now
    # Both directions: a timestamp from the future is as suspicious as an old one.
    if message.timestamp is not None and abs(now - message.timestamp) > tolerance_seconds:
        raise TimestampOutOfTolerance(verified=message)
    return message


def _require(headers: Mapping[str, str], *names: str) -> list[str]:
    missing = [name for name in names if not headers.get(name)]
    if missing:
        raise MissingSignatureHeaders(f"Missing header(s): {', '.join(missing)}.")
    return [headers[name] for name in names]


def _parse_timestamp(raw: str, header: str) -> int:
    if not raw.isascii() or not raw.isdigit():
        raise MalformedSignatureHeaders(f"{header} must be an integer Unix timestamp.")
    return int(raw)


def _any_match(expected: Iterable[bytes], presented: Iterable[bytes]) -> bool:
    presented = list(presented)
    matched = False
    for candidate in expected:
        for signature in presented:
            # no short-circuit: every pair is compared
            matched |= hmac.compare_digest(candidate, signature)
    return matched


# --- Standard Webhooks -------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def standard_secret_key(secret: str) -> bytes:
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


def _verify_standard(secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes):
    msg_id, raw_ts, raw_sigs = _require(
        headers, "webhook-id", "webhook-timestamp", "webhook-signature"
    )
    timestamp = _parse_timestamp(raw_ts, "webhook-timestamp")
    # other versions (e.g. the asymmetric v1a) are not ours to check
    encoded = [
        sig for version, _, sig in (e.partition(",") for e in raw_sigs.split()) if version == "v1"
    ]
    if not encoded:
        raise MalformedSignatureHeaders("webhook-signature holds no 'v1,<base64>' entry.")
    presented = [_b64decode_or_empty(sig) for sig in encoded]
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = (hmac.new(standard_secret_key(s), signed, hashlib.sha256).digest() for s in secrets)
    if not _any_match(expected, presented):
        raise InvalidSignature()
    return VerifiedMessage(scheme="standard", message_id=msg_id, timestamp=timestamp)


# --- Stripe ------------------------------------------------------------------------


def _verify_stripe(secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes):
    (raw,) = _require(headers, "stripe-signature")
    timestamp: int | None = None
    presented: list[bytes] = []
    for item in raw.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            timestamp = _parse_timestamp(value, "Stripe-Signature t")
        elif key == "v1":
            presented.append(value.encode("utf-8", "replace"))
    if timestamp is None or not presented:
        raise MalformedSignatureHeaders("Stripe-Signature needs t=<timestamp> and v1=<hex>.")
    signed = f"{timestamp}.".encode() + body
    expected = (hmac.new(s.encode(), signed, hashlib.sha256).hexdigest().encode() for s in secrets)
    if not _any_match(expected, presented):
        raise InvalidSignature()
    return VerifiedMessage(scheme="stripe", message_id=None, timestamp=timestamp)


# --- GitHub ------------------------------------------------------------------------


def _verify_github(secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes):
    # GitHub signs no timestamp: replay protection rests on the idempotency key alone.
    (raw,) = _require(headers, "x-hub-signature-256")
    algorithm, _, hexdigest = raw.partition("=")
    if algorithm != "sha256" or not hexdigest:
        raise MalformedSignatureHeaders("X-Hub-Signature-256 must be 'sha256=<hex>'.")
    expected = (hmac.new(s.encode(), body, hashlib.sha256).hexdigest().encode() for s in secrets)
    if not _any_match(expected, [hexdigest.encode("utf-8", "replace")]):
        raise InvalidSignature()
    return VerifiedMessage(
        scheme="github", message_id=headers.get("x-github-delivery") or None, timestamp=None
    )


_VERIFIERS = {
    "standard": _verify_standard,
    "stripe": _verify_stripe,
    "github": _verify_github,
}


# --- Signing (for test events and host-project tests) ---------------------------------


def sign(
    *, scheme: str, secret: str, body: bytes, message_id: str, timestamp: int
) -> dict[str, str]:
    """Return the headers a sender of ``scheme`` would attach to ``body``."""
    if scheme == "standard":
        signed = f"{message_id}.{timestamp}.".encode() + body
        digest = hmac.new(standard_secret_key(secret), signed, hashlib.sha256).digest()
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": "v1," + base64.b64encode(digest).decode(),
        }
    if scheme == "stripe":
        signed = f"{timestamp}.".encode() + body
        digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        return {"Stripe-Signature": f"t={timestamp},v1={digest}"}
    if scheme == "github":
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": message_id}
    raise ValueError(f"unknown scheme {scheme!r}")
