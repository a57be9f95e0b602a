"""A secret's fingerprint: a short, stable name for a signing secret that reveals nothing
of it, so that an audit record, a form's checkbox or an operator's screen can say *which*
secret without showing it.

The first 16 hex digits of the secret's SHA-256 (64 bits): enough to tell a source's few
secrets apart, and for a random secret (every scheme's senders generate one) no help in
finding it. A secret someone chose by hand and could guess is as guessable from its
fingerprint as from anywhere else: signing secrets should be random.
"""

from __future__ import annotations

import functools
import hashlib

FINGERPRINT_LENGTH = 16


@functools.lru_cache(maxsize=256)  # the same few secrets, request after request
def secret_fingerprint(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:FINGERPRINT_LENGTH]
