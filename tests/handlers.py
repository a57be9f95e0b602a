"""Handlers that misbehave on purpose, wired in through WEBHOOK_RECEIVER['HANDLERS']."""

from __future__ import annotations

import os
import signal

from webhook_receiver.handlers import HandlerResult, WebhookEvent
from webhook_receiver.models import InventoryLedgerEntry

failures_left = {"count": 0}


def _write_ledger_row(event: WebhookEvent) -> None:
    InventoryLedgerEntry.objects.create(
        order_id=event.data["order_id"],
        sku="CRASH",
        delta=-1,
        reason="test",
        event_key=event.event_key,
    )


def fails_after_writing(event: WebhookEvent) -> HandlerResult:
    """Writes its ledger row, then fails while ``failures_left`` lasts."""
    _write_ledger_row(event)
    if failures_left["count"] > 0:
        failures_left["count"] -= 1
        raise RuntimeError("handler crashed after its ledger write")
    return HandlerResult(subject=event.data["order_id"])


def killed_after_writing(event: WebhookEvent) -> HandlerResult:
    """Writes its ledger row, then the process dies mid-transaction (SIGKILL)."""
    _write_ledger_row(event)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
