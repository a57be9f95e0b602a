"""A fourth signature scheme, written the way a host project would add one."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from webhook_receiver.exceptions import InvalidSignature
from webhook_receiver.schemes.base import Scheme, VerifiedMessage, any_match, require


class Acme(Scheme):
    """``X-Acme-Signature: <hex HMAC-SHA256 of the body>``; the id and type in the body."""

    name = "acme"

    def verify(self, *, secrets, headers, body) -> VerifiedMessage:
        (presented,) = require(headers, "x-acme-signature")
        expected = (
            hmac.new(s.encode(), body, hashlib.sha256).hexdigest().encode() for s in secrets
        )
        if not any_match(expected, [presented.encode("utf-8", "replace")]):
            raise InvalidSignature()
        return VerifiedMessage(scheme=self.name, message_id=None, timestamp=None)

    def sign(self, *, secret, body, message_id, timestamp) -> dict[str, str]:
        return {"X-Acme-Signature": hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}

    def event_type(self, *, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        return payload.get("kind")

    def default_key(self, *, payload: Mapping[str, Any], message: VerifiedMessage) -> Any:
        return payload.get("event_id")

    def secret_problem(self, secret: str) -> str | None:
        return "is shorter than 16 characters" if len(secret) < 16 else None
