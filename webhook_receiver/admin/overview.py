"""The overview page: one row per source and destination, coloured by state, with the
reasons and links to the records behind each figure, a one-line verdict on top, and a
chart of the last 24 hours (chart.py). It hangs on the SourceOverview proxy, which puts
"Overview" on the admin index behind its own view permission, as does the trace page
(trace.py). Everything is server-rendered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..conf import app_settings
from ..core.states import Reason, State
from ..inbound.models import FailedEvent, RequestAudit, WebhookReceipt
from ..outbound.models import OutboxMessage, WebhookDestination
from ..presentation.admin_links import admin_url
from ..presentation.display import ago_text, duration_text
from ..reconcile.models import ReconciliationRun, RepairItem
from ..watch.models import SilenceAlert, SourceOverview
from ..watch.readings import Readings
from ..watch.sources import LAST_HOUR
from ..watch.status import status_read
from ..watch.statuses import AUDIT, RECEIPTS, DestinationStatus, SourceStatus
from ..watch.traffic import ActivityBucket, GapStats, activity_series, observed_gaps
from .base import ReadOnlyAdmin, visible_response
from .chart import chart_svg
from .trace import trace_page

TEMPLATE = "admin/webhook_receiver/overview.html"
# a word and a shape for each state, so that colour is never the only signal
ICONS = {State.OK: "✔", State.ATTENTION: "▲", State.ALERT: "✖"}
WORDS = {State.OK: _("OK"), State.ATTENTION: _("Attention"), State.ALERT: _("Alert")}


@dataclass(frozen=True)
class Link:
    text: str
    url: str | None  # None: the user may not view that list

    @property
    def html(self) -> SafeString:
        """An anchor, or the text alone."""
        if self.url is None:
            return format_html("{}", self.text)
        return format_html('<a href="{}">{}</a>', self.url, self.text)


@dataclass(frozen=True)
class ReasonLine:
    reason: Reason
    link: Link | None


def _duration(delta: timedelta | None) -> str | None:
    """A duration in words; None where there is none (the page then leaves it out)."""
    return None if delta is None else duration_text(delta)


class _Stated:
    """A row's state, as a CSS class's word and as a badge."""

    status: SourceStatus | DestinationStatus

    @property
    def state(self) -> str:
        return self.status.state.label

    @property
    def badge(self) -> SafeString:
        return badge(self.status.state)


@dataclass(frozen=True)
class Row(_Stated):
    status: SourceStatus
    gaps: GapStats | None
    last_accepted: Link
    accepted: Link
    refused: Link
    retrying: Link
    dead: Link
    silence_alert: Link | None
    last_run: Link | None
    repairs: Link | None
    reasons: list[ReasonLine]

    @property
    def oldest_retry(self) -> str | None:
        return _duration(self.status.oldest_retry_age)

    @property
    def silence_window(self) -> str | None:
        return _duration(self.status.silence_after)

    @property
    def gap_p50(self) -> str:
        return duration_text(self.gaps.p50) if self.gaps else ""

    @property
    def gap_p99(self) -> str:
        return duration_text(self.gaps.p99) if self.gaps else ""

    @property
    def gap_max(self) -> str:
        return duration_text(self.gaps.max) if self.gaps else ""

    @property
    def last_run_age(self) -> str:
        run = self.status.last_run
        if run is None:
            return ""
        return gettext("started %(age)s ago") % {
            "age": duration_text(self.status.now - run.started_at)
        }


@dataclass(frozen=True)
class DestinationRow(_Stated):
    status: DestinationStatus
    name: Link
    backlog: Link
    failed: Link
    reasons: list[ReasonLine]

    @property
    def oldest_due(self) -> str | None:
        return _duration(self.status.oldest_eligible_age)

    @property
    def breaker(self) -> str:
        if self.status.disabled_by_relay:
            return gettext("disabled by the relay")
        breaker = self.status.breaker
        if breaker.state == "open" and breaker.until is not None:
            return gettext("open, probe in %(wait)s") % {
                "wait": duration_text(breaker.until - self.status.now)
            }
        return breaker.state

    @property
    def last_success(self) -> str:
        at = self.status.last_success_at
        return ago_text(self.status.now - at) if at is not None else gettext("never")


def overview_page(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    now = timezone.now()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": gettext("Overview"),
        "subtitle": None,
        "opts": model_admin.opts,
        "now": now,
        "time_zone": timezone.get_current_timezone_name(),
    }
    request.current_app = model_admin.admin_site.name
    try:
        context |= _figures(model_admin, request, now)
    except DatabaseError as exc:  # what the readings do not cover (each is bounded)
        context["unreadable"] = gettext("The status could not be read: %(error)s") % {"error": exc}
        return TemplateResponse(request, TEMPLATE, context, status=503)
    # a part unread (a locked table): the page shows the rest, and is no 200 "all well"
    status = 200 if context["verdict"].complete else 503
    return TemplateResponse(request, TEMPLATE, context, status=status)


def _figures(model_admin: admin.ModelAdmin, request: HttpRequest, now: datetime) -> dict:
    """Everything the page shows, read from the database, each part on its own bound
    (watch/readings.py): a locked table leaves its parts unread and named, the rest
    shown."""
    readings = Readings(app_settings().status_timeout_seconds)
    status = status_read(now=now, readings=readings)
    verdict = status.verdict
    links = _Links(request, model_admin.admin_site, now)
    rows = [
        links.row(s, readings.read(RECEIPTS, [WebhookReceipt], _gaps(s.source, now), None))
        for s in status.sources
    ]
    destination_rows = [links.destination_row(d) for d in status.destinations]
    # each chart with its 24 hours' totals: a flood of refusals (one that made up its
    # slugs too, under "(not configured)") reads at a glance, whatever its bars' scale
    series: dict[str, list[ActivityBucket]] = readings.read(
        AUDIT, [RequestAudit], partial(activity_series, now=now), {}
    )
    charts = [
        (key, chart_svg(b), sum(x.accepted for x in b), sum(x.rejected for x in b))
        for key, b in series.items()
    ]
    known = verdict.label != "unknown"
    return {
        "verdict": verdict,
        "verdict_state": verdict.state.label if known else State.ALERT.label,
        "verdict_badge": badge(verdict.state) if known else unknown_badge(),
        "unread": readings.unread,
        "rows": rows,
        "destination_rows": destination_rows,
        "charts": charts,
        "audit_per_minute": app_settings().rejected_audit_per_minute,
    }


def _gaps(source: str, now: datetime) -> Callable[[], GapStats | None]:
    return lambda: observed_gaps(source=source, now=now)


def badge(state: State) -> SafeString:
    return format_html(
        '<span class="wr-badge wr-{}">{} {}</span>', state.label, ICONS[state], WORDS[state]
    )


def unknown_badge() -> SafeString:
    """A verdict with a part unread: neither OK nor any state read."""
    return format_html('<span class="wr-badge wr-alert">? {}</span>', gettext("Unknown"))


class _Links:
    """Links to the admin's lists, filtered to what a figure counts; None where the user
    may not view the list (or it is not registered)."""

    def __init__(self, request: HttpRequest, site: admin.AdminSite, now: datetime) -> None:
        self.request, self.site, self.now = request, site, now

    def url(self, model: type[Model], **query: Any) -> str | None:
        return self._admin_url(model, "changelist", **query)

    def change_url(self, model: type[Model], pk: int) -> str | None:
        return self._admin_url(model, "change", pk)

    def _admin_url(self, model: type[Model], view: str, *args: Any, **query: Any) -> str | None:
        try:
            model_admin = self.site.get_model_admin(model)
        except NotRegistered:
            return None
        if not model_admin.has_view_permission(self.request):
            return None
        return admin_url(model, view, *args, site=self.site.name, **query)

    def row(self, s: SourceStatus, gaps: GapStats | None) -> Row:
        source = s.source
        age = s.last_accepted_age
        alert = s.silence_alert
        run = s.last_run
        failed = {
            "retrying": self.url(FailedEvent, source=source, status__exact="retrying"),
            "dead": self.url(FailedEvent, source=source, status__exact="dead"),
        }
        return Row(
            status=s,
            gaps=gaps,
            last_accepted=Link(
                gettext("never") if age is None else ago_text(age),
                self.url(WebhookReceipt, source=source),
            ),
            accepted=Link(
                gettext("%(count)d accepted") % {"count": s.accepted_total}, self.audit_url(source)
            ),
            refused=Link(
                gettext("%(count)d refused") % {"count": s.rejected_total}, self.audit_url(source)
            ),
            retrying=Link(
                gettext("%(count)d retrying") % {"count": s.retrying}, failed["retrying"]
            ),
            dead=Link(gettext("%(count)d dead") % {"count": s.dead}, failed["dead"]),
            silence_alert=None
            if alert is None
            else Link(
                gettext("alert open %(age)s") % {"age": duration_text(self.now - alert.opened_at)},
                self.url(SilenceAlert, source=source, resolved_at__isnull="True"),
            ),
            last_run=None
            if run is None
            else Link(
                run.get_outcome_display(),
                self.url(ReconciliationRun, source=source),
            ),
            repairs=Link(
                ngettext(
                    "%(count)d open repair item", "%(count)d open repair items", s.open_repair_total
                )
                % {"count": s.open_repair_total},
                self.url(RepairItem, source=source, status__exact="open"),
            )
            if s.open_repair_total
            else None,
            reasons=[ReasonLine(r, self.reason_link(r, source, failed)) for r in s.reasons],
        )

    def destination_row(self, d: DestinationStatus) -> DestinationRow:
        messages = {
            "backlog": self.url(
                OutboxMessage, destination__id__exact=d.pk, status__in="pending,sending"
            ),
            "failed": self.url(OutboxMessage, destination__id__exact=d.pk, status__exact="failed"),
        }
        reason_urls = {
            "messages_failed": messages["failed"],
            "breaker_open": self.change_url(WebhookDestination, d.pk),
            "relay_not_sending": messages["backlog"],
            "behind": messages["backlog"],
            "disabled_with_backlog": self.change_url(WebhookDestination, d.pk),
            "record_failing": self.change_url(WebhookDestination, d.pk),
        }
        if d.first_holder is not None:  # the oldest failed message holding others back
            reason_urls["held_back"] = self.change_url(OutboxMessage, d.first_holder[0])
        return DestinationRow(
            status=d,
            name=Link(d.name, self.change_url(WebhookDestination, d.pk)),
            backlog=Link(gettext("%(count)d to send") % {"count": d.backlog}, messages["backlog"]),
            failed=Link(gettext("%(count)d failed") % {"count": d.failed}, messages["failed"]),
            reasons=[
                ReasonLine(r, Link(gettext("show"), reason_urls.get(r.code))) for r in d.reasons
            ],
        )

    def audit_url(self, source: str) -> str | None:
        since = (self.now - LAST_HOUR).replace(microsecond=0)
        return self.url(RequestAudit, source=source, received_at__gte=since.isoformat())

    def reason_link(self, reason: Reason, source: str, failed: dict[str, str | None]) -> Link:
        url = {
            "silent": lambda: self.url(SilenceAlert, source=source, resolved_at__isnull="True"),
            "repair_needed": lambda: self.url(RepairItem, source=source, status__exact="open"),
            "dead_letters": lambda: failed["dead"],
            "old_retry": lambda: failed["retrying"],
            "retries_stalled": lambda: failed["retrying"],
            "not_stored": lambda: self.audit_url(source),
            "rejected": lambda: self.audit_url(source),
            "reconcile_failed": lambda: self.url(ReconciliationRun, source=source),
        }.get(reason.code, lambda: None)()
        return Link(gettext("show"), url)


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
        return visible_response(overview_page(self, request))

    def trace_view(self, request: HttpRequest) -> HttpResponse:
        return visible_response(trace_page(self, request))
