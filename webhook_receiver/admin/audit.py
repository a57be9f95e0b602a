"""RequestAudit: one row per request to the endpoint, accepted or not."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..inbound.models import RequestAudit
from .base import ReadOnlyAdmin
from .cells import trace_link


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
        "trace",
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
    # the detail page: every field (read-only, as the admin has no change permission) and
    # the trace link last
    readonly_fields = ("trace",)

    @admin.display(description=_("trace"))
    def trace(self, obj: RequestAudit) -> str:
        return trace_link(obj.source, obj.event_key)
