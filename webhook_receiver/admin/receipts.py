"""WebhookReceipt: one per verified event claimed, with its outcome, body and headers."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..inbound.models import WebhookReceipt
from ..presentation import display
from .base import ReadOnlyAdmin, StoredEventDisplay
from .cells import pre, trace_link


@admin.register(WebhookReceipt)
class WebhookReceiptAdmin(StoredEventDisplay, ReadOnlyAdmin):
    list_display = (
        "received_at",
        "source",
        "event_type",
        "status",
        "subject",
        "event_key",
        "trace",
    )
    list_filter = ("source", "status", "event_type", ("received_at", admin.DateFieldListFilter))
    search_fields = ("event_key__exact", "subject__exact")
    date_hierarchy = "received_at"
    exclude = ("body", "headers", "outcome")
    readonly_fields = (
        *StoredEventDisplay.event_fields,
        "status",
        "subject",
        "received_at",
        "trace",
        "pretty_outcome",
        "pretty_body",
        "pretty_headers",
    )

    @admin.display(description=_("outcome"))
    def pretty_outcome(self, obj: WebhookReceipt) -> str:
        return pre(display.json_text(obj.outcome))

    @admin.display(description=_("trace"))
    def trace(self, obj: WebhookReceipt) -> str:
        return trace_link(obj.source, obj.event_key)
