"""RequestAudit: one row per request to the endpoint, accepted or not."""

from __future__ import annotations

from django.contrib import admin

from ..models import RequestAudit
from .base import ReadOnlyAdmin


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
    search_fields = ("event_key__exact",)
    date_hierarchy = "received_at"
