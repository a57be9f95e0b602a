"""Read-only admin: the receive path's records are evidence, not data to edit."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from .models import InventoryLedgerEntry, OrderState, RequestAudit, WebhookReceipt


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _pre(text: str) -> str:
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


@admin.register(WebhookReceipt)
class WebhookReceiptAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "source", "event_type", "status", "subject", "event_key")
    list_filter = ("source", "status", "event_type", ("received_at", admin.DateFieldListFilter))
    search_fields = ("=event_key", "=message_id", "=subject")
    date_hierarchy = "received_at"
    exclude = ("body", "headers", "outcome")
    readonly_fields = (
        "source",
        "event_key",
        "event_type",
        "message_id",
        "signature_timestamp",
        "status",
        "subject",
        "received_at",
        "pretty_outcome",
        "pretty_body",
        "pretty_headers",
    )

    @admin.display(description="outcome")
    def pretty_outcome(self, obj: WebhookReceipt) -> str:
        return _pre(json.dumps(obj.outcome, indent=2, sort_keys=True))

    @admin.display(description="body")
    def pretty_body(self, obj: WebhookReceipt) -> str:
        raw = bytes(obj.body)
        try:
            text = json.dumps(json.loads(raw), indent=2, sort_keys=True, ensure_ascii=False)
        except ValueError:
            text = raw.decode("utf-8", "replace")
        return _pre(text)

    @admin.display(description="headers")
    def pretty_headers(self, obj: WebhookReceipt) -> str:
        return _pre("\n".join(f"{k}: {v}" for k, v in sorted(obj.headers.items())))


@admin.register(RequestAudit)
class RequestAuditAdmin(ReadOnlyAdmin):
    list_display = (
        "received_at",
        "source",
        "response_status",
        "verification",
        "result",
        "event_key",
        "remote_addr",
    )
    list_filter = (
        "source",
        "verification",
        "response_status",
        "result",
        ("received_at", admin.DateFieldListFilter),
    )
    search_fields = ("=event_key", "=message_id", "=body_sha256")
    date_hierarchy = "received_at"


@admin.register(InventoryLedgerEntry)
class InventoryLedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "order_id", "sku", "delta", "reason", "event_key")
    list_filter = ("reason", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=order_id", "=sku", "=event_key")
    date_hierarchy = "created_at"


@admin.register(OrderState)
class OrderStateAdmin(ReadOnlyAdmin):
    list_display = ("order_id", "status", "version", "updated_at", "event_key")
    list_filter = ("status", ("updated_at", admin.DateFieldListFilter))
    search_fields = ("=order_id", "=event_key")
    date_hierarchy = "updated_at"
