"""What a destination's signing secret must be, said once for every way one is set (the
admin's form, ``manage.py webhook_destination``): a Standard Webhooks secret, ``whsec_``
and base64, of at least ``SECRET_MIN_BYTES`` decoded bytes (the specification's
minimum: a shorter HMAC key is easier to guess, and some receivers refuse it).
"""

from __future__ import annotations

from ..schemes.base import SECRET_MIN_BYTES
from ..schemes.standard import secret_key

# an ed25519 signing key (asymmetric signatures) has rules of its own, checked elsewhere
SIGNING_KEY_PREFIX = "whsk_"


def destination_secret_problem(value: str) -> str | None:
    """Why ``value`` cannot sign a destination's requests, or None. The reason never
    repeats the value: the caller names the line or the flag."""
    if value.startswith(SIGNING_KEY_PREFIX):
        return None
    if not value.startswith("whsec_"):
        return "is not a Standard Webhooks secret: whsec_ followed by base64"
    try:
        size = len(secret_key(value))
    except ValueError:
        return "is not a Standard Webhooks secret: whsec_ followed by base64"
    if size < SECRET_MIN_BYTES:
        return (
            f"holds {size} bytes of key material once decoded; a destination's secret needs "
            f"at least {SECRET_MIN_BYTES} (e.g. whsec_ + the base64 of 32 random bytes)"
        )
    return None
