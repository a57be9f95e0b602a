"""Signature verification: one module per scheme, and the registry that names them.

``verify()`` takes a scheme's name, the configured secrets, the request headers and the
body exactly as received, and returns a ``VerifiedMessage`` or raises a
``RejectedRequest`` subclass. It never parses the body and never touches the database.
The signature is checked before the timestamp: a ``timestamp_out_of_tolerance``
therefore always means an authentic but stale (or early) request, which is worth
knowing when reading the audit trail.

Adding a scheme: a module with a ``Scheme`` subclass, and one line in ``SCHEMES``. A
host project can also name its own class by dotted path in a source's ``SCHEME``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping

from django.utils.module_loading import import_string

from ..exceptions import TimestampOutOfTolerance
from .base import Scheme, VerifiedMessage
from .github import GitHub
from .standard import StandardWebhooks
from .standard import secret_key as standard_secret_key
from .stripe import Stripe

SCHEMES: dict[str, Scheme] = {
    "standard": StandardWebhooks(),
    "stripe": Stripe(),
    "github": GitHub(),
}

__all__ = [
    "SCHEMES",
    "Scheme",
    "VerifiedMessage",
    "get_scheme",
    "sign",
    "standard_secret_key",
    "verify",
]


@functools.cache
def get_scheme(name: str) -> Scheme:
    """The scheme registered as ``name``, or the ``Scheme`` class at a dotted path.
    Raises ``LookupError`` when there is neither."""
    if name in SCHEMES:
        return SCHEMES[name]
    if "." in name:
        try:
            found = import_string(name)
        except ImportError as exc:
            raise LookupError(f"{name!r} cannot be imported: {exc}") from exc
        if isinstance(found, type) and issubclass(found, Scheme):
            return found()
        raise LookupError(f"{name!r} is not a webhook_receiver.schemes.Scheme subclass")
    raise LookupError(f"no scheme {name!r}; the built-in ones are {', '.join(SCHEMES)}")


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
    message = get_scheme(scheme).verify(secrets=tuple(secrets), headers=lowered, body=body)
    now = time.time() if now is None else now
    # Both directions: a timestamp from the future is as suspicious as an old one.
    if message.timestamp is not None and abs(now - message.timestamp) > tolerance_seconds:
        raise TimestampOutOfTolerance(verified=message)
    return message


def sign(
    *, scheme: str, secret: str, body: bytes, message_id: str, timestamp: int
) -> dict[str, str]:
    """The headers a sender of ``scheme`` would attach to ``body`` (for test events and
    host-project tests)."""
    return get_scheme(scheme).sign(
        secret=secret, body=body, message_id=message_id, timestamp=timestamp
    )
