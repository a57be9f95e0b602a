"""The overview page (one row per source: is anything wrong?) and the trace page (the
whole story of one event key). Neither has a table: they hang on the SourceOverview
proxy, which puts "Overview" on the admin index behind its own view permission."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from ..watch.models import SourceOverview
from .base import ReadOnlyAdmin, visible_response


@admin.register(SourceOverview)
class SourceOverviewAdmin(ReadOnlyAdmin):
    def get_urls(self) -> list[URLPattern]:
        trace = path(
            "trace/",
            self.admin_site.admin_view(self.trace_view),
            name="webhook_receiver_trace",
        )
        return [trace, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        from .overview_page import overview_page

        return visible_response(overview_page(self, request))

    def trace_view(self, request: HttpRequest) -> HttpResponse:
        from .trace import trace_page

        return visible_response(trace_page(self, request))
