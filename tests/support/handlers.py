"""Handlers that misbehave on purpose, wired in through WEBHOOK_RECEIVER['HANDLERS']."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from project.shop.models import InventoryLedgerEntry
from webhook_receiver.handlers import HandlerResult, WebhookEvent

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


def hangs_on_first_attempt(event: WebhookEvent) -> HandlerResult:
    """Writes its ledger row; the first time, then leaves a marker file and hangs, so
    that a test can kill the worker inside the open claim transaction."""
    _write_ledger_row(event)
    marker = Path(os.environ["WEBHOOK_TEST_MARKER_DIR"]) / event.event_key
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(120)
    return HandlerResult(subject=event.data["order_id"])


in_flight: dict[str, int] = {}
executions: list[str] = []
overlaps: list[str] = []
_lock = threading.Lock()


def tracks_concurrency(event: WebhookEvent) -> HandlerResult:
    """Records how many workers run the same event at once."""
    with _lock:
        in_flight[event.event_key] = in_flight.get(event.event_key, 0) + 1
        if in_flight[event.event_key] > 1:
            overlaps.append(event.event_key)
        executions.append(event.event_key)
    try:
        time.sleep(0.02)
        _write_ledger_row(event)
    finally:
        with _lock:
            in_flight[event.event_key] -= 1
    return HandlerResult(subject=event.data["order_id"])


def poison(event: WebhookEvent) -> HandlerResult:
    """Always fails with an error the app does not know: transient until it runs out."""
    raise ConnectionError("the dependency behind this event is down")


key_failures_left = {"count": 0}


def flaky_order_key(*, payload, message) -> str:
    """An EVENT_KEY function with a bug, while ``key_failures_left`` lasts."""
    if key_failures_left["count"] > 0:
        key_failures_left["count"] -= 1
        raise KeyError("order_ref")
    return f"order:{payload['data']['order_id']}:{payload['type']}"


sweep_delay = {"seconds": 0.0}
transactions: list[tuple[str, int]] = []


def records_its_transaction(event: WebhookEvent) -> HandlerResult:
    """Takes ``sweep_delay`` seconds, writes its ledger row and records the database
    transaction it ran in; then fails for an order whose id ends in ``_fail``."""
    from django.db import connection

    time.sleep(sweep_delay["seconds"])
    _write_ledger_row(event)
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current()")
        transactions.append((event.event_key, cursor.fetchone()[0]))
    if event.data["order_id"].endswith("_fail"):
        raise RuntimeError("this order's dependency is down")
    return HandlerResult(subject=event.data["order_id"])
