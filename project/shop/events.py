"""The events the shop sends its merchants: its part of the event catalog
(``@webhook_event``; docs/sending.md#the-event-catalog). ``enqueue_webhook`` checks each
order event against it, and ``GET /webhooks-catalog/openapi.json`` describes them."""

from __future__ import annotations

from rest_framework import serializers

from webhook_receiver.outbound import webhook_event

from .models import OrderStatus


class OrderChanged(serializers.Serializer):
    """An order moved to a status at a version."""

    order_id = serializers.CharField(max_length=100, help_text="The shop's order id.")
    status = serializers.ChoiceField(choices=OrderStatus.values, help_text="Its new status.")
    version = serializers.IntegerField(
        min_value=0,
        help_text="The order's version: keep the highest seen; an event of a lower one is stale.",
    )


def _example(status: OrderStatus) -> dict[str, object]:
    return {"order_id": "ord-1042", "status": status.value, "version": 3}


webhook_event(
    "order.paid",
    serializer=OrderChanged,
    description="An order was paid: it may be fulfilled.",
    example=_example(OrderStatus.PAID),
)
webhook_event(
    "order.cancelled",
    serializer=OrderChanged,
    description="An order was cancelled: release what was held for it.",
    example=_example(OrderStatus.CANCELLED),
)
webhook_event(
    "order.fulfilled",
    serializer=OrderChanged,
    description="An order was fulfilled: it has left the warehouse.",
    example=_example(OrderStatus.FULFILLED),
)
