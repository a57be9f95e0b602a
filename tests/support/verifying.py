"""The app's ``verify`` at the tests' tolerance: five minutes, the documented default."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from webhook_receiver.schemes import VerifiedMessage, verify

TOLERANCE = 300


def verify_scheme(
    scheme: str,
    headers: Mapping[str, str],
    body: bytes,
    secrets: Iterable[str],
    now: float | None = None,
) -> VerifiedMessage:
    return verify(
        scheme=scheme,
        secrets=secrets,
        headers=headers,
        body=body,
        tolerance_seconds=TOLERANCE,
        now=now,
    )
