"""SilenceAlert: sources that went quiet, one row per incident. Read-only: the checks
open and resolve alerts (watch/silence.py), people read them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..inbound.models import RequestAudit
from ..presentation.admin_links import admin_url
from ..presentation.display import duration_text
from ..watch.models import SilenceAlert
from .base import ReadOnlyAdmin

# a label, and below it a moment that wraps as a whole or not at all
NOWRAP = '{}<br><span style="white-space: nowrap">{}</span>'


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple]:
        return [("open", _("Open")), ("resolved", _("Resolved"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "open":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


def _moment(moment: datetime) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M}"


def _exactly(
    field: str, description: Any, empty: Any = "-"
) -> Callable[[admin.ModelAdmin, SilenceAlert], str]:
    @admin.display(description=description, ordering=field)
    def show(model_admin: admin.ModelAdmin, obj: SilenceAlert) -> str:
        moment = getattr(obj, field)
        return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}" if moment else empty

    return show


@admin.register(SilenceAlert)
class SilenceAlertAdmin(ReadOnlyAdmin):
    # narrow enough for a laptop beside the admin's sidebar: the resolution time shares
    # the state's column, and the audit link is on each alert's page
    list_display = ("source", "state", "silent_since", "duration", "rejected", "opened")
    list_filter = ("source", StateFilter)
    date_hierarchy = "opened_at"
    fields = (
        "source",
        "state",
        "last_accepted",
        "duration",
        "silence_after",
        "rejected",
        "opened_exactly",
        "last_checked",
        "resolved_exactly",
        "resolved_by_event",
        "opened_notice_sent",
        "recovery_notice_sent",
        "requests",
    )
    readonly_fields = fields

    @admin.display(description=_("state"), ordering="resolved_at")
    def state(self, obj: SilenceAlert) -> str:
        if obj.resolved_at is None:
            return format_html(
                '<strong style="color: var(--error-fg)">{}</strong>', gettext("open")
            )
        return format_html(NOWRAP, gettext("resolved"), _moment(obj.resolved_at))

    @admin.display(description=_("silent since"), ordering="last_accepted_at")
    def silent_since(self, obj: SilenceAlert) -> str:
        # the last accepted event
        if obj.last_accepted_at is None:
            return gettext("never accepted an event")
        return _moment(obj.last_accepted_at)

    @admin.display(description=_("silent for"))
    def duration(self, obj: SilenceAlert) -> str:
        if obj.last_accepted_at is None:
            return "-"
        end = obj.resolved_by_event_at or obj.resolved_at or timezone.now()
        text = duration_text(end - obj.last_accepted_at)
        return text if obj.resolved_at else gettext("%(duration)s so far") % {"duration": text}

    @admin.display(description=_("window"))
    def silence_after(self, obj: SilenceAlert) -> str:
        return (
            f"{duration_text(timedelta(seconds=obj.silence_after_seconds))} (SILENCE_AFTER_SECONDS)"
        )

    @admin.display(description=_("refused (last window)"))
    def rejected(self, obj: SilenceAlert) -> str:
        if not obj.rejected_total:
            return gettext("none")
        # one reason per line: the codes are long, and the list must fit a laptop
        reasons = sorted(obj.rejected_counts.items(), key=lambda item: (-item[1], item[0]))
        return format_html(
            "<strong>{}</strong><br>{}",
            obj.rejected_total,
            format_html_join(
                mark_safe("<br>"), '<span style="white-space: nowrap">{}: {}</span>', reasons
            ),
        )

    @admin.display(description=_("opened"), ordering="opened_at")
    def opened(self, obj: SilenceAlert) -> str:
        return _moment(obj.opened_at)

    @admin.display(description=_("requests"))
    def requests(self, obj: SilenceAlert) -> str:
        path = admin_url(RequestAudit, source=obj.source)
        text = gettext("every request from %(source)s, accepted or refused") % {
            "source": obj.source
        }
        return format_html('<a href="{}">{}</a>', path, text) if path else "-"

    # the alert's page: every moment to the second, with its time zone
    last_accepted = _exactly("last_accepted_at", _("last accepted event"), _("never"))
    opened_exactly = _exactly("opened_at", _("opened"))
    last_checked = _exactly("last_checked_at", _("last checked"))
    resolved_exactly = _exactly("resolved_at", _("resolved"))
    resolved_by_event = _exactly("resolved_by_event_at", _("accepted event that resolved it"))
    opened_notice_sent = _exactly("opened_notice_sent_at", _("notice sent"))
    recovery_notice_sent = _exactly("recovery_notice_sent_at", _("recovery notice sent"))
