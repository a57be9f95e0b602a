"""Defects planted in the relay's real code for a test, through pytest's monkeypatch:
the harness and its report must show the invariant each breaks."""

from __future__ import annotations

import pytest

from webhook_receiver.outbound.relay import limits


def limiter_overspends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limiter finds its bucket full whenever it looks (limits.refilled, which
    decides the bucket on both databases)."""
    monkeypatch.setattr(limits, "refilled", lambda dest, now: 1000.0)
