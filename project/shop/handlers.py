"""The demo shop's webhook handlers: its business effects, run in the claim's transaction.

``inventory.reserved`` / ``inventory.released`` append one ledger entry per line (minus
the quantity when reserved, plus when released): the ledger is a function of the *set*
of applied events, so any order of arrival converges.

``order.paid`` / ``order.cancelled`` / ``order.fulfilled`` move an order's state forward
in version only; an older or equal version changes nothing and is recorded as stale.
A move is forwarded to every destination subscribed to its type, through the outbox and
in the same transaction: the message exists if and only if the move committed.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.utils import timezone

from webhook_receiver.core import sql
from webhook_receiver.exceptions import InvalidPayload
from webhook_receiver.handlers import HandlerResult, Result, WebhookEvent, webhook_handler
from webhook_receiver.outbound import destinations_for, enqueue_webhook, message_key

from .models import InventoryLedgerEntry, OrderState, OrderStatus


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidPayload(f"{what} must be a JSON object.")
    return value


def _text(data: dict[str, Any], key: str, max_length: int = 100) -> str:
    value = data.get(key)
    # printable: no NUL (which the database refuses) nor other control characters
    if (
        not isinstance(value, str)
        or not value
        or len(value) > max_length
        or not value.isprintable()
    ):
        raise InvalidPayload(
            f"'{key}' must be a non-empty string of at most {max_length} printable characters."
        )
    return value


INT32_MAX = 2**31 - 1  # IntegerField
INT64_MAX = 2**63 - 1  # BigIntegerField


def _integer(data: dict[str, Any], key: str, minimum: int, maximum: int) -> int:
    value = data.get(key)
    # bool is an int subclass in Python; true is not a version
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise InvalidPayload(f"'{key}' must be an integer from {minimum} to {maximum}.")
    return value


# --- inventory ---------------------------------------------------------------------


def _stock_movement(event: WebhookEvent, *, sign: int, reason: str) -> HandlerResult:
    data = _object(event.data, "data")
    order_id = _text(data, "order_id")
    _integer(data, "version", minimum=0, maximum=INT64_MAX)
    lines = data.get("lines")
    if not isinstance(lines, list) or not lines:
        raise InvalidPayload("'lines' must be a non-empty list.")
    now = timezone.now()
    entries = []
    for line in lines:
        line = _object(line, "each line")
        entries.append(
            {
                "order_id": order_id,
                "sku": _text(line, "sku"),
                "delta": sign * _integer(line, "quantity", minimum=1, maximum=INT32_MAX),
                "reason": reason,
                "event_key": event.event_key,
                "created_at": now,
            }
        )
    sql.insert_rows(InventoryLedgerEntry, entries)  # one statement for all the lines
    return HandlerResult()


@webhook_handler("inventory.reserved")
def inventory_reserved(event: WebhookEvent) -> HandlerResult:
    return _stock_movement(event, sign=-1, reason="reserved")


@webhook_handler("inventory.released")
def inventory_released(event: WebhookEvent) -> HandlerResult:
    return _stock_movement(event, sign=+1, reason="released")


# --- orders ------------------------------------------------------------------------


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


def _order_transition(event: WebhookEvent, status: OrderStatus) -> HandlerResult:
    data = _object(event.data, "data")
    order_id = _text(data, "order_id")
    version = _integer(data, "version", minimum=0, maximum=INT64_MAX)
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


@webhook_handler("order.paid")
def order_paid(event: WebhookEvent) -> HandlerResult:
    return _order_transition(event, OrderStatus.PAID)


@webhook_handler("order.cancelled")
def order_cancelled(event: WebhookEvent) -> HandlerResult:
    return _order_transition(event, OrderStatus.CANCELLED)


@webhook_handler("order.fulfilled")
def order_fulfilled(event: WebhookEvent) -> HandlerResult:
    return _order_transition(event, OrderStatus.FULFILLED)
