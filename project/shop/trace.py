"""The shop's part of the trace page (WEBHOOK_RECEIVER['TRACE_EFFECTS']): what one event
wrote to the shop's tables.

The handlers record the event key on every row they write (``InventoryLedgerEntry`` and
``OrderState.event_key``), so the event's own lines are one index lookup. An order's
state keeps only the key of the last event that moved it, so an event that moved an
order which later events moved on is found through the order it concerned (the receipt's
subject, or its ledger lines).
"""

from __future__ import annotations

import json

from django.db.models import Q
from django.urls import reverse
from django.utils.http import urlencode

from webhook_receiver.models import FailedEvent, WebhookReceipt
from webhook_receiver.watch.trace import EffectSection

from .models import InventoryLedgerEntry, OrderState

MAX_LINES = 200
ORDER_ID_MAX_LENGTH = OrderState._meta.get_field("order_id").max_length


def shop_effects(*, source: str, event_key: str) -> list[EffectSection]:
    receipt_sources = set(
        WebhookReceipt.objects.filter(event_key=event_key).values_list("source", flat=True)
    )
    # A handler's rows commit with the receipt of (source, key), and only with it. Without
    # that receipt this event wrote nothing, whatever rows another source's event of the
    # same key wrote (the rows carry the key, not its source).
    committed = source in receipt_sources
    lines: list[InventoryLedgerEntry] = []
    if committed:
        lines = list(InventoryLedgerEntry.objects.filter(event_key=event_key).order_by("id"))
    order_ids = {line.order_id for line in lines}
    subject = _order_concerned(source, event_key)
    if subject:
        order_ids.add(subject)
    # the orders it concerned, and any order it moved (two index lookups)
    moved = Q(event_key=event_key) if committed else Q(pk__in=[])
    states = list(OrderState.objects.filter(Q(order_id__in=order_ids) | moved))
    caveat = ""
    if committed and len(receipt_sources) > 1:
        others = ", ".join(sorted(receipt_sources - {source}))
        caveat = f"Source {others} has a receipt with this key too: rows may be its."
    elif not committed and receipt_sources:
        caveat = (
            f"Rows with this key belong to source {', '.join(sorted(receipt_sources))}, "
            "not to this one."
        )
    return [_ledger(event_key, lines, caveat), _orders(event_key, states, caveat)]


def _order_concerned(source: str, event_key: str) -> str:
    """The order the event concerns: its receipt's subject, or, for an event held as a
    failed event (no receipt), its stored body's ``data.order_id``."""
    subject = (
        WebhookReceipt.objects.filter(event_key=event_key, source=source)
        .values_list("subject", flat=True)
        .first()
    )
    if subject:
        return subject
    body = (
        FailedEvent.objects.filter(event_key=event_key, source=source)
        .values_list("body", flat=True)
        .first()
    )
    if body is None:
        return ""
    try:
        data = json.loads(bytes(body)).get("data")
    except (ValueError, RecursionError, AttributeError):
        return ""  # not JSON, nested too deep to read, or not an object: no order to show
    order_id = data.get("order_id") if isinstance(data, dict) else None
    # An id the handlers refuse (NUL or another control character, longer than the
    # column) was never stored, so no order holds it; PostgreSQL would refuse even the
    # lookup of one holding NUL.
    if not isinstance(order_id, str) or not order_id.isprintable():
        return ""
    return order_id if len(order_id) <= ORDER_ID_MAX_LENGTH else ""


def _ledger(event_key: str, lines: list[InventoryLedgerEntry], caveat: str) -> EffectSection:
    rows = [
        (
            f"{line.created_at:%Y-%m-%d %H:%M:%S}",
            line.order_id,
            line.sku,
            f"{line.delta:+d}",
            line.reason,
        )
        for line in lines[:MAX_LINES]
    ]
    note = caveat
    if len(lines) > MAX_LINES:
        note = f"First {MAX_LINES} of {len(lines)} lines. {caveat}".strip()
    return EffectSection(
        title="Inventory ledger lines written by this event",
        columns=("created (UTC)", "order", "sku", "delta", "reason"),
        rows=rows,
        admin_url=_changelist("shop_inventoryledgerentry", event_key),
        note=note,
    )


def _orders(event_key: str, states: list[OrderState], caveat: str) -> EffectSection:
    rows = [
        (
            state.order_id,
            state.status,
            str(state.version),
            f"{state.updated_at:%Y-%m-%d %H:%M:%S}",
            "yes" if state.event_key == event_key else f"no: {state.event_key}",
        )
        for state in sorted(states, key=lambda s: s.order_id)
    ]
    return EffectSection(
        title="Order state the event concerns",
        columns=("order", "status now", "version now", "updated (UTC)", "set by this event"),
        rows=rows,
        admin_url=_changelist("shop_orderstate", rows[0][0]) if len(rows) == 1 else "",
        note=caveat,
    )


def _changelist(model: str, query: str) -> str:
    return f"{reverse(f'admin:{model}_changelist')}?{urlencode({'q': query})}"
