"""Standard Webhooks' asymmetric signatures (``v1a``): Ed25519 over the same signed
content as ``v1`` (``{id}.{timestamp}.{body}``), from ``cryptography``.

Keys are written as their prefix and the base64 of their bytes:

- ``whsk_``: a signing (private) key, the 32-byte seed; the 64-byte form of some
  libraries (seed, then public key) is accepted too, its halves checked to agree;
- ``whpk_``: a public key, 32 bytes.

The signing key stays with the sender (a destination's encrypted secrets); the receiver
is given only the public key, which verifies and cannot sign.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

VERSION = "v1a"
SIGNING_PREFIX = "whsk_"
PUBLIC_PREFIX = "whpk_"
SEED_BYTES = 32
PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
# v1a entries one request may carry: each costs an Ed25519 verification (about 0.1 ms)
# per public key, and a sender sends one per key it signs with (two during a rotation)
MAX_SIGNATURES = 16


def is_signing_key(secret: str) -> bool:
    return secret.startswith(SIGNING_PREFIX)


def is_public_key(secret: str) -> bool:
    return secret.startswith(PUBLIC_PREFIX)


def _decode(encoded: str) -> bytes:
    encoded += "=" * (-len(encoded) % 4)  # keys are often shown unpadded
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters
        raise ValueError("not base64") from None


def _public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@functools.lru_cache(maxsize=64)
def signing_key(secret: str) -> Ed25519PrivateKey:
    """The private key of a ``whsk_`` key; ``ValueError`` when it is not one."""
    if not is_signing_key(secret):
        raise ValueError(f"a signing key starts with {SIGNING_PREFIX}")
    raw = _decode(secret.removeprefix(SIGNING_PREFIX))
    if len(raw) not in (SEED_BYTES, SEED_BYTES + PUBLIC_BYTES):
        raise ValueError("a signing key is a 32-byte Ed25519 seed (or seed and public key)")
    key = Ed25519PrivateKey.from_private_bytes(raw[:SEED_BYTES])
    if len(raw) > SEED_BYTES and raw[SEED_BYTES:] != _public_bytes(key.public_key()):
        raise ValueError("the public half of a 64-byte signing key is not its seed's")
    return key


@functools.lru_cache(maxsize=64)
def public_key(secret: str) -> Ed25519PublicKey:
    """The public key of a ``whpk_`` key; ``ValueError`` when it is not one."""
    if not is_public_key(secret):
        raise ValueError(f"a public key starts with {PUBLIC_PREFIX}")
    raw = _decode(secret.removeprefix(PUBLIC_PREFIX))
    if len(raw) != PUBLIC_BYTES:
        raise ValueError("a public key is 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def new_signing_key() -> str:
    """A new random ``whsk_`` key (its 32-byte seed)."""
    seed = Ed25519PrivateKey.generate().private_bytes_raw()
    return SIGNING_PREFIX + base64.b64encode(seed).decode()


def public_key_of(secret: str) -> str:
    """The ``whpk_`` public key of a ``whsk_`` signing key: what the receiver is given."""
    raw = _public_bytes(signing_key(secret).public_key())
    return PUBLIC_PREFIX + base64.b64encode(raw).decode()


def public_keys_of(secrets: Iterable[str]) -> list[str]:
    """The public keys of the signing keys among ``secrets``, in their order."""
    return [public_key_of(secret) for secret in secrets if is_signing_key(secret)]


def sign(secret: str, signed: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``signed`` by a ``whsk_`` key."""
    return signing_key(secret).sign(signed)


def verify(secret: str, signed: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the ``whpk_`` key's over ``signed``."""
    if len(signature) != SIGNATURE_BYTES:
        return False
    try:
        public_key(secret).verify(signature, signed)
    except InvalidSignature:
        return False
    return True
