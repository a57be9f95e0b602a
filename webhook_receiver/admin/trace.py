"""The trace page: the whole story of one event key, in the order it happened.

Reached from a "trace" link on any audit record, receipt or failed event, or by typing a
key into its form. ``?source=…&key=…``; without a source, every source holding the key is
traced. Guarded by the view permission on the overview (SourceOverview).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..conf import app_settings
from ..presentation import display
from ..watch.trace import EventTrace, event_key_sources, event_trace

TEMPLATE = "admin/webhook_receiver/trace.html"
ANY_SOURCE = ""


class TraceForm(forms.Form):
    source = forms.ChoiceField(required=False, label=_("Source"))
    key = forms.CharField(max_length=255, strip=True, label=_("Event key"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sources = set(app_settings().sources)
        # a link from the record of a source no longer configured still traces it
        requested = (self.data.get("source") or "")[:100]
        if requested:
            sources.add(requested)
        cast(forms.ChoiceField, self.fields["source"]).choices = [
            (ANY_SOURCE, gettext("any source")),
            *((slug, slug) for slug in sorted(sources)),
        ]
        self.fields["key"].widget.attrs.update(size=60, autofocus=True)


def trace_page(model_admin: Any, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    form = TraceForm(request.GET if "key" in request.GET else None)
    traces: list[EventTrace] = []
    key = ""
    if form.is_valid():
        key = form.cleaned_data["key"]
        source = form.cleaned_data["source"]
        sources = [source] if source else event_key_sources(event_key=key)
        traces = [event_trace(source=s, event_key=key, tracebacks=True) for s in sources]
    now = timezone.now()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": gettext("Trace %(key)s") % {"key": key} if key else gettext("Trace an event"),
        "subtitle": None,
        "opts": model_admin.opts,
        "form": form,
        "key": key,
        "traces": [_page_trace(trace, now) for trace in traces],
        "effects_configured": bool(app_settings().trace_effects),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _page_trace(trace: EventTrace, now: datetime) -> dict[str, Any]:
    """The trace, with what the template cannot compute: ages to the second, and the
    receipt's outcome as indented JSON."""
    receipt, failed = trace.receipt, trace.failed

    def ago(moment: datetime) -> str:
        return display.ago_text(now - moment)

    return {
        "trace": trace,
        "deliveries": [{"d": d, "age": ago(d.received_at)} for d in trace.deliveries],
        "outcome": display.json_text(receipt.outcome) if receipt else "",
        "ages": {
            "receipt": ago(receipt.received_at) if receipt else "",
            "first": ago(failed.first_attempt_at) if failed else "",
            "last": ago(failed.last_attempt_at) if failed else "",
            "next": ago(failed.next_attempt_at) if failed and failed.next_attempt_at else "",
        },
    }
