"""GitHub: ``X-Hub-Signature-256: sha256=<hex>``, an HMAC-SHA256 of the body alone.

GitHub signs no timestamp: a captured delivery verifies whenever it is resent, and
replay protection rests on the event key (``X-GitHub-Delivery``) alone."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from ..exceptions import InvalidSignature, MalformedSignatureHeaders
from .base import Scheme, VerifiedMessage, any_match, require


def _digest(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class GitHub(Scheme):
    name = "github"
    # GitHub also sends the older SHA-1 signature whenever a secret is set
    signature_headers = ("x-hub-signature-256", "x-hub-signature")

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
        if not any_match(expected, presented):
            raise InvalidSignature()
        delivery = headers.get("x-github-delivery") or None
        return VerifiedMessage(scheme=self.name, message_id=delivery, timestamp=None)

    def sign(self, *, secret: str, body: bytes, message_id: str, timestamp: int) -> dict[str, str]:
        return {
            "X-Hub-Signature-256": f"sha256={_digest(secret, body)}",
            "X-GitHub-Delivery": message_id,
        }

    def event_type(self, *, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        return headers.get("X-GitHub-Event")  # the body has no type of its own
