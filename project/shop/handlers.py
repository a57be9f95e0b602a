"""The demo shop's webhook handlers: its business effects, run in the claim's transaction.

``inventory.reserved`` / ``inventory.released`` append one ledger entry per line (minus
the quantity when reserved, plus when released): the ledger is a function of the *set*
of applied events, so any order of arrival converges.

``order.paid`` / ``order.cancelled`` / ``order.fulfilled`` move an order's state forward
in version only; an older or equal version changes nothing and is recorded as stale.
A move is forwarded to every destination subscribed to its type, through the outbox and
in the same transaction: the message exists if and only if the move committed.

Each handler declares the serializer of its event's ``data`` and receives the validated
data: a body that does not fit is dead-lettered with DRF's words for each field.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework import serializers

from webhook_receiver.core import sql
from webhook_receiver.handlers import HandlerResult, Result, WebhookEvent, webhook_handler
from webhook_receiver.outbound import destinations_for, enqueue_webhook, message_key

from .models import InventoryLedgerEntry, OrderState, OrderStatus


class Text(serializers.CharField):
    """A string as given: never a number turned into one, never trimmed, printable (no
    NUL, which the database refuses, nor other control characters)."""

    default_error_messages = {"not_printable": "Must be printable: no control characters."}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if not data.isprintable():
            self.fail("not_printable")
        return super().to_internal_value(data)


class Integer(serializers.IntegerField):
    """An integer as given: not a string of digits, not a float, not true or false."""

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


INT32_MAX = 2**31 - 1  # IntegerField
INT64_MAX = 2**63 - 1  # BigIntegerField


class Line(serializers.Serializer):
    sku = Text(max_length=100)
    quantity = Integer(min_value=1, max_value=INT32_MAX)


class StockMovement(serializers.Serializer):
    """``inventory.reserved`` and ``inventory.released``: an order's lines."""

    order_id = Text(max_length=100)
    version = Integer(min_value=0, max_value=INT64_MAX)
    lines = Line(many=True, allow_empty=False)


class OrderMove(serializers.Serializer):
    """``order.paid``, ``order.cancelled``, ``order.fulfilled``: an order at a version."""

    order_id = Text(max_length=100)
    version = Integer(min_value=0, max_value=INT64_MAX)


# --- inventory ---------------------------------------------------------------------


def _stock_movement(
    event: WebhookEvent, data: dict[str, Any], *, sign: int, reason: str
) -> HandlerResult:
    now = timezone.now()
    entries = [
        {
            "order_id": data["order_id"],
            "sku": line["sku"],
            "delta": sign * line["quantity"],
            "reason": reason,
            "event_key": event.event_key,
            "created_at": now,
        }
        for line in data["lines"]
    ]
    sql.insert_rows(InventoryLedgerEntry, entries)  # one statement for all the lines
    return HandlerResult()


@webhook_handler("inventory.reserved", serializer=StockMovement)
def inventory_reserved(event: WebhookEvent, data: dict[str, Any]) -> HandlerResult:
    return _stock_movement(event, data, sign=-1, reason="reserved")


@webhook_handler("inventory.released", serializer=StockMovement)
def inventory_released(event: WebhookEvent, data: dict[str, Any]) -> HandlerResult:
    return _stock_movement(event, data, sign=+1, reason="released")


# --- orders ------------------------------------------------------------------------

# The sources whose order events move money: the shop's own. An order.paid named by any
# other source (a GitHub source's unsigned X-GitHub-Event header, say) finds no handler
# and is recorded as ignored.
ORDER_SOURCES = ("shop",)


# Move an order to a status at a version, unless it already holds that version or a newer
# one. One upsert: the row lock taken by ON CONFLICT DO UPDATE makes concurrent deliveries
# for one order serialise, and the WHERE is evaluated on the latest row. A row comes
# back only when the state moved.
ADVANCE_ORDER_STATE = """
    INSERT INTO shop_orderstate (order_id, status, version, event_key, updated_at)
    VALUES (%(order_id)s, %(status)s, %(version)s, %(event_key)s, %(updated_at)s)
    ON CONFLICT (order_id) DO UPDATE
        SET status = excluded.status, version = excluded.version,
            event_key = excluded.event_key, updated_at = excluded.updated_at
        WHERE shop_orderstate.version < excluded.version
    RETURNING id
"""


def order_state_advance(*, order_id: str, status: str, version: int, event_key: str) -> bool:
    """Move an order forward (see ADVANCE_ORDER_STATE); return whether it moved."""
    row = {
        "order_id": order_id,
        "status": status,
        "version": version,
        "event_key": event_key,
        "updated_at": timezone.now(),
    }
    with connection.cursor() as cursor:
        cursor.execute(ADVANCE_ORDER_STATE, sql.adapt(row, OrderState))
        return cursor.fetchone() is not None


def _order_transition(
    event: WebhookEvent, data: dict[str, Any], status: OrderStatus
) -> HandlerResult:
    order_id, version = data["order_id"], data["version"]
    moved = order_state_advance(
        order_id=order_id, status=status, version=version, event_key=event.event_key
    )
    if not moved:
        detail = {"order_id": order_id, "order_status": status.value, "version": version}
        return HandlerResult(status=Result.STALE, detail=detail)
    order_event_forward(event, order_id=order_id, status=status, version=version)
    return HandlerResult()


def order_event_forward(
    event: WebhookEvent, *, order_id: str, status: OrderStatus, version: int
) -> None:
    """Admit the order's move to every subscribed destination, in the claim's transaction.
    The key names the order, the event and its version: the same for every attempt and
    every redelivery, so the merchant's end can deduplicate on it."""
    destinations = destinations_for(event.event_type)
    if not destinations:
        return
    key = message_key("order", order_id, event.event_type.removeprefix("order."), version)
    payload = {
        "type": event.event_type,
        "data": {"order_id": order_id, "status": status.value, "version": version},
    }
    for destination in destinations:
        enqueue_webhook(
            destination,
            event.event_type,
            key,
            payload,
            ordering_key=f"order:{order_id}",
            origin=(event.source, event.event_key),
        )


@webhook_handler("order.paid", serializer=OrderMove, sources=ORDER_SOURCES)
def order_paid(event: WebhookEvent, data: dict[str, Any]) -> HandlerResult:
    return _order_transition(event, data, OrderStatus.PAID)


@webhook_handler("order.cancelled", serializer=OrderMove, sources=ORDER_SOURCES)
def order_cancelled(event: WebhookEvent, data: dict[str, Any]) -> HandlerResult:
    return _order_transition(event, data, OrderStatus.CANCELLED)


@webhook_handler("order.fulfilled", serializer=OrderMove, sources=ORDER_SOURCES)
def order_fulfilled(event: WebhookEvent, data: dict[str, Any]) -> HandlerResult:
    return _order_transition(event, data, OrderStatus.FULFILLED)
