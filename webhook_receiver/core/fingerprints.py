"""A secret's fingerprint: a short, stable name for a signing secret that reveals nothing
of it, so that an audit record, a form's checkbox or an operator's screen can say *which*
secret without showing it.

The first 16 hex digits (64 bits) of an HMAC-SHA256 of the secret keyed by the server's
``SECRET_KEY`` (Django's ``salted_hmac``, with a salt of its own): enough to tell a
source's few secrets apart, and no oracle for the secret. Unkeyed, a fingerprint let
whoever could read the audit records (view-only staff) test guesses offline, and a
secret chosen by hand fell in a few hundred; keyed, a guess can only be tested by whoever
holds the server's key, who can read the secrets anyway.

Changing ``SECRET_KEY`` changes every fingerprint: the audit records written before no
longer name a current secret, and a secret's "last verified" starts again (the admin and
``webhook_source list`` say "verified no request in the audit records kept").
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.utils.crypto import salted_hmac

FINGERPRINT_LENGTH = 16
SALT = "webhook_receiver.secret_fingerprint"


def secret_fingerprint(secret: str) -> str:
    """The secret's fingerprint under the server's current key."""
    return _keyed(secret, settings.SECRET_KEY)


@functools.lru_cache(maxsize=256)  # the same few secrets, request after request
def _keyed(secret: str, server_key: str) -> str:
    digest = salted_hmac(
        SALT, secret.encode("utf-8", "surrogatepass"), secret=server_key, algorithm="sha256"
    )
    return digest.hexdigest()[:FINGERPRINT_LENGTH]
