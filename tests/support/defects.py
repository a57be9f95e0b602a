"""Defects planted in the relay's real code for a test, through pytest's monkeypatch:
the harness and its report must show the invariant each breaks."""

from __future__ import annotations

import pytest

from webhook_receiver.outbound import queries
from webhook_receiver.outbound.relay import claim


def limiter_overspends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limiter finds its bucket full whenever it looks: the claim's refill, in its
    statement on PostgreSQL (queries.REFILLED) and in Python on SQLite."""
    monkeypatch.setattr(claim, "_refilled", lambda dest, now: 1000.0)
    full = {skip: sql.replace(queries.REFILLED, " 1000.0 ") for skip, sql in queries.CLAIM.items()}
    monkeypatch.setattr(queries, "CLAIM", full)
