"""Helpers for reconciliation tests: a source's RECONCILE block (the senders are
tests/support/peers.py's)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from webhook_receiver.models import ReconciliationRun, RunOutcome


def reconcile_with(settings, slug: str, **reconcile: Any) -> None:
    """Give source ``slug`` this RECONCILE block, for the test that calls it."""
    source = {**settings.WEBHOOK_RECEIVER["SOURCES"][slug], "RECONCILE": reconcile}
    sources = {**settings.WEBHOOK_RECEIVER["SOURCES"], slug: source}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}


def needs_repair_run(now: datetime) -> ReconciliationRun:
    """A run of "shop" over the hour before ``now`` that found something to repair."""
    return ReconciliationRun.objects.create(
        source="shop",
        window_start=now - timedelta(hours=1),
        window_end=now,
        started_at=now,
        outcome=RunOutcome.NEEDS_REPAIR,
    )
