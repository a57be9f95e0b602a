from __future__ import annotations

from django.db import models


class InventoryLedgerEntry(models.Model):
    """Append-only stock movements; the stock of a SKU is the sum of its deltas."""

    order_id = models.CharField(max_length=100)
    sku = models.CharField(max_length=100)
    delta = models.IntegerField()
    reason = models.CharField(max_length=64)
    # the webhook event that caused the movement
    event_key = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Index names kept from the release that shipped these models inside
        # webhook_receiver, so that an upgraded database matches a new one.
        indexes = [
            models.Index(fields=["order_id"], name="webhook_ledger_order"),
            models.Index(fields=["sku"], name="webhook_ledger_sku"),
            models.Index(fields=["event_key"], name="webhook_ledger_event_key"),
        ]
        verbose_name_plural = "inventory ledger entries"
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.sku} {self.delta:+d} ({self.order_id})"


class OrderStatus(models.TextChoices):
    PAID = "paid", "Paid"
    CANCELLED = "cancelled", "Cancelled"
    FULFILLED = "fulfilled", "Fulfilled"


class OrderState(models.Model):
    """The latest known state of an order; only ever moves forward in version."""

    order_id = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=OrderStatus.choices)
    version = models.BigIntegerField()
    event_key = models.CharField(max_length=255)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            # the ON CONFLICT target of the forward-only upsert
            models.UniqueConstraint(fields=["order_id"], name="webhook_order_state_order"),
        ]
        indexes = [models.Index(fields=["event_key"], name="webhook_order_state_event_key")]
        ordering = ["order_id"]

    def __str__(self) -> str:
        return f"{self.order_id}: {self.status} v{self.version}"
