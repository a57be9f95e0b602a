"""Helpers for reconciliation tests: a source's RECONCILE block (the senders are
tests/support/peers.py's)."""

from __future__ import annotations

from typing import Any


def reconcile_with(settings, slug: str, **reconcile: Any) -> None:
    """Give source ``slug`` this RECONCILE block, for the test that calls it."""
    source = {**settings.WEBHOOK_RECEIVER["SOURCES"][slug], "RECONCILE": reconcile}
    sources = {**settings.WEBHOOK_RECEIVER["SOURCES"], slug: source}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}
