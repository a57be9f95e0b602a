"""What every signature scheme is, and the pieces they share.

A scheme verifies the raw request bytes (a pure function: no parsing of the body, no
database), signs them the way its senders do, and says where its events carry their
type and their default event key. ``verify`` in this package's ``__init__`` adds the
timestamp tolerance, the same for every scheme.

Comparisons: every configured secret is compared with every presented signature
through ``hmac.compare_digest``, with no early exit, so timing reveals neither which
secret nor which signature matched. Which secret did is said afterwards, in the
``VerifiedMessage`` (its position among the source's secrets).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import MalformedSignatureHeaders, MissingSignatureHeaders

# The least key material a signing secret should hold: the Standard Webhooks minimum
# (24 bytes; its own secrets are 24 to 64). One rule (weak_secret_problem): a shorter
# secret is refused where it is given to this app to keep (a destination's, a source
# record's), unless its scheme's senders take whatever a person typed (GitHub), and
# warned of where it cannot be refused (the settings' sources: W003; such a record: W006).
SECRET_MIN_BYTES = 24


@dataclass(frozen=True)
class VerifiedMessage:
    scheme: str
    message_id: str | None  # the scheme's delivery id, when it has one
    timestamp: int | None  # signature timestamp (Unix seconds), when the scheme signs one
    # the SHA-256 of the signed bytes, for a scheme whose message id is not signed
    # (GitHub): a key derived from it cannot be changed by whoever resends the body
    body_sha256: str | None = None
    # which of the configured secrets verified it (its position), for the audit record's
    # fingerprint during a rotation; None when the scheme does not say
    secret_index: int | None = None


class Scheme:
    """One signature scheme. Subclass it, set ``name``, and implement ``verify`` and
    ``sign``; override the rest where the scheme differs from Standard Webhooks."""

    name: str = ""
    # the request headers that carry its signatures (lower case): redacted before an
    # event's headers are stored, and whenever stored headers are shown
    signature_headers: tuple[str, ...] = ()
    # whether the sender generates the secret (Stripe, Standard Webhooks: always long):
    # a short one is then refused on a record; False where the secret is whatever a person
    # typed into the sender's settings (GitHub), which is warned of, not refused
    sender_generates_secrets: bool = True

    def verify(
        self, *, secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes
    ) -> VerifiedMessage:
        """Check the signature over ``body``; ``headers`` have lower-case names.
        Raise a ``RejectedRequest`` subclass when it does not hold."""
        raise NotImplementedError

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        """The headers a sender of this scheme attaches to ``body``."""
        raise NotImplementedError

    def event_type(self, *, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        """Where the event's type is: the body's ``type`` unless the scheme says otherwise.
        ``headers`` are case-insensitive here."""
        return payload.get("type")

    def default_key(self, *, payload: Mapping[str, Any], message: VerifiedMessage) -> Any:
        """The event key when the source names no EVENT_KEY function: the message id."""
        return message.message_id

    def secret_problem(self, secret: str) -> str | None:
        """Why ``secret`` cannot be used with this scheme, or None (system check E002)."""
        return None

    def secret_bytes(self, secret: str) -> int:
        """How many bytes of key material ``secret`` gives the HMAC (system check W003
        compares it with SECRET_MIN_BYTES): its UTF-8 bytes, which most schemes key with."""
        return len(secret.encode("utf-8", "surrogatepass"))


def require(headers: Mapping[str, str], *names: str) -> list[str]:
    """The values of ``names``, refusing the request when any is missing or empty."""
    missing = [name for name in names if not headers.get(name)]
    if missing:
        raise MissingSignatureHeaders(f"Missing header(s): {', '.join(missing)}.")
    return [headers[name] for name in names]


# Converting a few dozen digits is cheap, and a signed absurd timestamp then fails the
# tolerance check like any other (401, authentic but not now); thousands of digits are
# refused as malformed before int() is asked (which itself refuses more than 4300).
TIMESTAMP_MAX_DIGITS = 32


def parse_timestamp(raw: str, header: str) -> int:
    if len(raw) > TIMESTAMP_MAX_DIGITS or not raw.isascii() or not raw.isdigit():
        raise MalformedSignatureHeaders(
            f"{header} must be a Unix timestamp in seconds: digits only, at most "
            f"{TIMESTAMP_MAX_DIGITS}."
        )
    return int(raw)


def matching_secret(expected: Iterable[bytes], presented: Iterable[bytes]) -> int | None:
    """The position of the first expected signature (one per configured secret, in their
    order) that a presented one matches, or None when none does."""
    presented = list(presented)
    found: int | None = None
    for index, candidate in enumerate(expected):
        matched = False
        for signature in presented:
            # no short-circuit: every pair is compared
            matched |= hmac.compare_digest(candidate, signature)
        if matched and found is None:
            found = index
    return found


def any_match(expected: Iterable[bytes], presented: Iterable[bytes]) -> bool:
    """Whether any expected signature matches a presented one (a host's scheme may use
    this when it does not say which secret verified)."""
    return matching_secret(expected, presented) is not None


def weak_secret_problem(scheme: Scheme, secret: str) -> str | None:
    """Why ``secret`` is too short a key for ``scheme`` (fewer than SECRET_MIN_BYTES of
    key material), never quoting it; None when it is long enough."""
    size = scheme.secret_bytes(secret)
    if size >= SECRET_MIN_BYTES:
        return None
    return (
        f"holds {size} bytes of key material, fewer than {SECRET_MIN_BYTES}: a short HMAC "
        "key is easier to guess"
    )
