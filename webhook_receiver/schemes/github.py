"""GitHub: ``X-Hub-Signature-256: sha256=<hex>``, an HMAC-SHA256 of the body alone.

GitHub signs no timestamp, nor the delivery id and event type, which travel in headers
(``X-GitHub-Delivery``, ``X-GitHub-Event``): a captured delivery verifies whenever it is
resent, and with the default key a resend under a new delivery id is a new event. A
source that must not accept that keys its events by the signed bytes instead:
``"EVENT_KEY": "webhook_receiver.schemes.github.signed_body_key"``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidSignature, MalformedSignatureHeaders
from .base import Scheme, VerifiedMessage, matching_secret, require


def _digest(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class GitHub(Scheme):
    name = "github"
    # GitHub also sends the older SHA-1 signature whenever a secret is set
    signature_headers = ("x-hub-signature-256", "x-hub-signature")
    # a GitHub secret is whatever was typed into the repository's webhook settings
    sender_generates_secrets = False

    def verify(
        self, *, secrets: tuple[str, ...], headers: Mapping[str, str], body: bytes
    ) -> VerifiedMessage:
        (raw,) = require(headers, "x-hub-signature-256")
        # a repeated header reaches us joined by a comma (WSGI): each part is checked
        presented = []
        for part in raw.split(","):
            algorithm, _, hexdigest = part.strip().partition("=")
            if algorithm != "sha256" or not hexdigest:
                raise MalformedSignatureHeaders("X-Hub-Signature-256 must be 'sha256=<hex>'.")
            presented.append(hexdigest.encode("utf-8", "replace"))
        expected = (_digest(secret, body).encode() for secret in secrets)
        index = matching_secret(expected, presented)
        if index is None:
            raise InvalidSignature()
        delivery = headers.get("x-github-delivery") or None
        return VerifiedMessage(
            scheme=self.name,
            message_id=delivery,
            timestamp=None,
            body_sha256=hashlib.sha256(body).hexdigest(),
            secret_index=index,
        )

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        return {
            "X-Hub-Signature-256": f"sha256={_digest(secret, body)}",
            "X-GitHub-Delivery": message_id,
        }

    def event_type(self, *, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        return headers.get("X-GitHub-Event")  # the body has no type of its own


def signed_body_key(*, payload: Mapping[str, Any], message: VerifiedMessage) -> str | None:
    """An EVENT_KEY for GitHub sources: the SHA-256 of the signed body, so that the same
    body resent under another ``X-GitHub-Delivery`` is a duplicate, not a new event. Two
    deliveries GitHub itself makes of one event share their body (a redelivery from its
    settings page included), and are one event here too."""
    return f"sha256:{message.body_sha256}" if message.body_sha256 else None
