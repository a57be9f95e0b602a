"""What a destination's signing secret must be, said once for every way one is set (the
admin's form, ``manage.py webhook_destination``): a Standard Webhooks secret, ``whsec_``
and base64, of at least ``SECRET_MIN_BYTES`` decoded bytes (the specification's
minimum: a shorter HMAC key is easier to guess, and some receivers refuse it), or an
Ed25519 signing key, ``whsk_`` and base64 (signature ``v1a``; its length is fixed).
A public key (``whpk_``) cannot sign.
"""

from __future__ import annotations

import base64
import secrets

from ..schemes.base import SECRET_MIN_BYTES
from ..schemes.standard import key_problem, secret_key
from ..schemes.standard_keys import is_public_key, is_signing_key, new_signing_key

NOT_A_SECRET = (
    "is not a Standard Webhooks secret: whsec_ followed by base64, or a signing key: "
    "whsk_ followed by the base64 of a 32-byte Ed25519 seed"
)


def destination_secret_problem(value: str) -> str | None:
    """Why ``value`` cannot sign a destination's requests, or None. The reason never
    repeats the value: the caller names the line or the flag."""
    if is_public_key(value):
        return "is a public key (whpk_), which cannot sign: give the whsk_ signing key"
    if is_signing_key(value):
        return key_problem(value)
    if not value.startswith("whsec_"):
        return NOT_A_SECRET
    try:
        size = len(secret_key(value))
    except ValueError:
        return NOT_A_SECRET
    if size < SECRET_MIN_BYTES:
        return (
            f"holds {size} bytes of key material once decoded; a destination's secret needs "
            f"at least {SECRET_MIN_BYTES} (e.g. whsec_ + the base64 of 32 random bytes)"
        )
    return None


def new_destination_secret(like: str = "") -> str:
    """A fresh secret of the kind ``like`` is (an Ed25519 signing key for ``whsk_``),
    else a Standard Webhooks secret of 32 random bytes."""
    if is_signing_key(like):
        return new_signing_key()
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
