"""The shop's admin: read-only, like the receiver's own records."""

from __future__ import annotations

from django.contrib import admin

from webhook_receiver.admin import ReadOnlyAdmin

from .models import InventoryLedgerEntry, OrderState


@admin.register(InventoryLedgerEntry)
class InventoryLedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "order_id", "sku", "delta", "reason", "event_key")
    list_filter = ("reason", ("created_at", admin.DateFieldListFilter))
    search_fields = ("order_id__exact", "sku__exact", "event_key__exact")
    date_hierarchy = "created_at"


@admin.register(OrderState)
class OrderStateAdmin(ReadOnlyAdmin):
    list_display = ("order_id", "status", "version", "updated_at", "event_key")
    list_filter = ("status", ("updated_at", admin.DateFieldListFilter))
    search_fields = ("order_id__exact", "event_key__exact")
    date_hierarchy = "updated_at"
