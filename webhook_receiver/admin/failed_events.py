"""FailedEvent: the one admin with operator actions, replay and discard.

Each action sits behind a permission of its own and goes through its service; the
discard form and the replay message are here with them. The detail page offers both
for its one event: its buttons open the same confirmation pages, and run the same code,
as the list's actions.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from ..models import FailedEvent, FailureStatus, Result
from ..services.failures import (
    ReplayResult,
    failed_event_discard,
    failed_event_replay,
)
from .base import ReadOnlyAdmin, StoredEventDisplay, trace_link, trace_url

MAX_FAILURES_LISTED = 5
# the list shows the start of the last error; its title holds the whole of it
LAST_ERROR_CHARS = 80
LAST_ERROR_TITLE_CHARS = 2000
# which statuses each action changes: a resolved event has nothing to replay (it would
# answer duplicate), and discard leaves resolved and discarded events as they are
REPLAYABLE = (FailureStatus.RETRYING, FailureStatus.DEAD, FailureStatus.DISCARDED)
DISCARDABLE = (FailureStatus.RETRYING, FailureStatus.DEAD)


class ReplayForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Optional: why, e.g. the fix deployed. Kept in the event's history with "
        "your name and the time.",
    )


class DiscardForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="Kept on each discarded event, with your name and the time.",
    )


@admin.register(FailedEvent)
class FailedEventAdmin(StoredEventDisplay, ReadOnlyAdmin):
    """Dead letters and retrying events: look, replay, or discard with a reason.

    The records themselves stay read-only and are never deleted from here: a dead one
    stays until a replay resolves it or an operator discards it, and the purge removes
    only resolved and discarded ones, after their retention.
    """

    # Fits 1400 px beside the admin's sidebar and the filters without sideways
    # scrolling (change_list.html lays the table out to the page's width): the source and
    # the trace link sit under the key, the attempts and the next attempt under the
    # status, so that the last error's message gets the room.
    list_display = ("event", "type_name", "state", "last_error")
    # the key links to the page itself (event), next to the trace link
    list_display_links = None
    list_filter = (
        "source",
        "status",
        "event_type",
        "last_error_class",
        ("last_attempt_at", admin.DateFieldListFilter),
    )
    search_fields = ("event_key__exact",)
    date_hierarchy = "last_attempt_at"
    actions = ["replay_selected", "discard_selected"]
    discard_confirmation_template = "admin/webhook_receiver/failedevent/discard_confirmation.html"
    replay_confirmation_template = "admin/webhook_receiver/failedevent/replay_confirmation.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "source",
                    "event_key",
                    "event_type",
                    "message_id",
                    "signature_timestamp",
                    "status",
                    "attempts",
                    "first_attempt_at",
                    "last_attempt_at",
                    "next_attempt_at",
                    "last_error_class",
                    "last_error_message",
                )
            },
        ),
        (
            "Operator",
            {
                "fields": (
                    "resolution",
                    "resolved_at",
                    "last_replayed_by",
                    "last_replayed_at",
                    "discarded_by",
                    "discarded_at",
                    "discard_reason",
                )
            },
        ),
        ("Event", {"fields": ("pretty_body", "pretty_headers")}),
        ("Error history", {"fields": ("error_history",)}),
    )
    # every field shown is read-only: the record is evidence
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    def get_queryset(self, request: HttpRequest) -> QuerySet[FailedEvent]:
        # The list needs none of the bulky columns; the detail page loads them on use.
        return super().get_queryset(request).defer("body", "headers", "errors")

    # --- permissions: the two custom ones from FailedEvent.Meta.permissions ----------

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "replay")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "discard")

    # --- list and detail ---------------------------------------------------------------

    @admin.display(description="event key", ordering="event_key")
    def event(self, obj: FailedEvent) -> str:
        change = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change",
            args=[quote(obj.pk)],
        )
        return format_html(
            '<a href="{}" class="wr-key">{}</a><span class="wr-under">{} · {}</span>',
            change,
            obj.event_key,
            obj.source,
            trace_link(obj.source, obj.event_key),
        )

    @admin.display(description="event type", ordering="event_type")
    def type_name(self, obj: FailedEvent) -> str:
        # a break allowed after each dot and underscore: types wrap between their words
        words = re.split(r"(?<=[._])", obj.event_type)
        return format_html_join(mark_safe("<wbr>"), "{}", ((w,) for w in words)) or "-"

    @admin.display(description="status", ordering="status")
    def state(self, obj: FailedEvent) -> str:
        """The status, then the attempts and when the last one failed, then (retrying)
        when the next one is due."""
        attempts = ngettext("%d attempt", "%d attempts", obj.attempts) % obj.attempts
        lines = [(obj.get_status_display(), "", "")]
        lines.append((attempts, "wr-under", ""))
        lines.append(
            (f"last {_compact_time(obj.last_attempt_at)}", "wr-under", obj.last_attempt_at)
        )
        if obj.next_attempt_at is not None:
            when = f"next {_compact_time(obj.next_attempt_at)}"
            lines.append((when, "wr-under", obj.next_attempt_at))
        return format_html_join(
            "",
            '<span class="wr-line {}" title="{}">{}</span>',
            ((css, _full_time(moment) if moment else "", text) for text, css, moment in lines),
        )

    @admin.display(description="last error", ordering="last_error_class")
    def last_error(self, obj: FailedEvent) -> str:
        """ "TimeoutError: the warehouse did not answer…": the class's own name and the
        start of the message, on one line; the full class and message in the title."""
        if not obj.last_error_class and not obj.last_error_message:
            return "-"
        name = obj.last_error_class.rsplit(".", 1)[-1]
        message = " ".join(obj.last_error_message.split())
        short = f"{name}: {message}" if message else name
        if len(short) > LAST_ERROR_CHARS:
            short = short[: LAST_ERROR_CHARS - 1].rstrip() + "…"
        full = f"{obj.last_error_class}: {obj.last_error_message}"[:LAST_ERROR_TITLE_CHARS]
        return format_html('<span title="{}">{}</span>', full, short)

    @admin.display(description="errors, oldest first")
    def error_history(self, obj: FailedEvent) -> str:
        entries = [e for e in obj.errors if isinstance(e, dict)] if obj.errors else []
        if not entries:
            return "-"
        return format_html_join(
            "",
            '<div style="margin-bottom: 1em">'
            "<p><strong>Attempt {}</strong> at {}: {} ({})</p>"
            "<p><code>{}</code>: {}</p>"
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>'
            "</div>",
            (
                (
                    entry.get("attempt", "?"),
                    entry.get("at", ""),
                    entry.get("trigger", ""),
                    entry.get("kind", ""),
                    entry.get("exception", ""),
                    entry.get("message", ""),
                    entry.get("traceback", ""),
                )
                for entry in entries
            ),
        )

    # --- the detail page's Replay and Discard buttons ------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        buttons = [
            path(
                "<path:object_id>/replay/",
                self.admin_site.admin_view(self.replay_view),
                name="{}_{}_replay".format(*info),
            ),
            path(
                "<path:object_id>/discard/",
                self.admin_site.admin_view(self.discard_view),
                name="{}_{}_discard".format(*info),
            ),
        ]
        return [*buttons, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        failed = self.get_object(request, unquote(object_id))
        buttons = self._buttons(request, failed) if failed is not None else {}
        return super().change_view(
            request, object_id, form_url, extra_context={**(extra_context or {}), **buttons}
        )

    def _buttons(self, request: HttpRequest, failed: FailedEvent) -> dict[str, str | None]:
        """The buttons' URLs: Replay and Discard for a user with the permission and an
        event whose status the action applies to; Trace for everyone."""
        urls: dict[str, str | None] = {
            "replay_url": None,
            "discard_url": None,
            "trace_url": trace_url(failed.source, failed.event_key) if failed.event_key else None,
        }
        for action, statuses in (("replay", REPLAYABLE), ("discard", DISCARDABLE)):
            if failed.status in statuses and self.has_custom_permission(request, action):
                urls[f"{action}_url"] = self._url(action, failed)
        return urls

    def _url(self, name: str, failed: FailedEvent) -> str:
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        return reverse("{}:{}_{}_".format(*info) + name, args=[quote(failed.pk)])

    def _one(
        self, request: HttpRequest, object_id: str, action: str, statuses: tuple[str, ...]
    ) -> tuple[FailedEvent, QuerySet[FailedEvent]] | HttpResponse:
        """The event a button acts on, as a one-row selection for the action's code; or
        where to go instead when the action does not apply to it."""
        failed = self.get_object(request, unquote(object_id))
        if failed is None:
            raise Http404("No failed event with that id.")
        if not (
            self.has_view_permission(request, failed)
            and self.has_custom_permission(request, action)
        ):
            raise PermissionDenied
        if failed.status not in statuses:
            self.message_user(
                request,
                f"A {failed.get_status_display().lower()} event cannot be {action}ed.",
                messages.WARNING,
            )
            return HttpResponseRedirect(self._url("change", failed))
        return failed, self.get_queryset(request).filter(pk=failed.pk)

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        found = self._one(request, object_id, "replay", REPLAYABLE)
        if isinstance(found, HttpResponse):
            return found
        failed, selection = found
        if request.method == "POST" and request.POST.get("post"):
            form = ReplayForm(request.POST)
            if form.is_valid():
                self._replay(request, selection, reason=form.cleaned_data["reason"])
                return HttpResponseRedirect(self._url("change", failed))
        else:
            form = ReplayForm()
        return self._replay_confirmation(request, [failed], form)

    def discard_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        found = self._one(request, object_id, "discard", DISCARDABLE)
        if isinstance(found, HttpResponse):
            return found
        failed, selection = found
        # the list's action itself: its confirmation page, its form, its messages
        response = self.discard_selected(request, selection)
        return response or HttpResponseRedirect(self._url("change", failed))

    def _replay_confirmation(
        self, request: HttpRequest, events: list[FailedEvent], form: ReplayForm
    ) -> TemplateResponse:
        return self.confirmation_page(
            request,
            self.replay_confirmation_template,
            form=form,
            note_field="reason",
            selected=events,
            action_name="replay_selected",
            title="Replay failed events",
            submit_label=ngettext("Replay %d event", "Replay %d events", len(events)) % len(events),
        )

    # --- actions -----------------------------------------------------------------------

    @admin.action(description="Replay selected failed events now", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> None:
        self._replay(request, queryset, reason="")

    def _replay(
        self, request: HttpRequest, queryset: QuerySet[FailedEvent], *, reason: str
    ) -> None:
        """Replay each event now, through its service; the admin's history keeps who, the
        result and the reason."""
        actor = request.user.get_username()
        reason = reason.strip()
        results: list[ReplayResult] = []
        for failed in queryset.order_by("id").only("id", "source", "event_key", "status"):
            result = failed_event_replay(failed_id=failed.pk, actor=actor)
            results.append(result)
            if result.result != Result.SKIPPED:
                note = f"Replayed: {result.result}" + (f". Reason: {reason}" if reason else "")
                self.log_change(request, failed, note)
        if not results:
            self.message_user(request, "Nothing to replay.", messages.WARNING)
            return
        self.message_user(request, *_replay_summary(results))

    @admin.action(description="Discard selected failed events…", permissions=["discard"])
    def discard_selected(
        self, request: HttpRequest, queryset: QuerySet[FailedEvent]
    ) -> TemplateResponse | None:
        events = list(queryset.order_by("id"))
        if request.POST.get("post"):
            form = DiscardForm(request.POST)
            if form.is_valid():
                self._discard(request, events, reason=form.cleaned_data["reason"])
                return None  # back to the list
        else:
            form = DiscardForm()
        return self.confirmation_page(
            request,
            self.discard_confirmation_template,
            form=form,
            note_field="reason",
            selected=events,
            action_name="discard_selected",
            title="Discard failed events",
            submit_label=ngettext("Discard %d event", "Discard %d events", len(events))
            % len(events),
            closed_statuses=(FailureStatus.RESOLVED, FailureStatus.DISCARDED),
        )

    def _discard(self, request: HttpRequest, events: list[FailedEvent], *, reason: str) -> None:
        actor = request.user.get_username()
        discarded = 0
        for failed in events:
            if failed_event_discard(failed_id=failed.pk, actor=actor, reason=reason):
                discarded += 1
                self.log_change(request, failed, f"Discarded: {reason}")
        left = len(events) - discarded
        message = ngettext(
            "Discarded %(count)d failed event.",
            "Discarded %(count)d failed events.",
            discarded,
        ) % {"count": discarded}
        if left:
            message += " " + ngettext(
                "%(count)d was left as it was (already resolved or discarded).",
                "%(count)d were left as they were (already resolved or discarded).",
                left,
            ) % {"count": left}
        self.message_user(request, message, messages.WARNING if left else messages.SUCCESS)


def _full_time(moment: datetime) -> str:
    return timezone.localtime(moment).isoformat(sep=" ", timespec="seconds")


def _compact_time(moment: datetime) -> str:
    """ "14:05:09" today, "Nov 30 14:05" on another day: narrow enough for the list."""
    local = timezone.localtime(moment)
    if local.date() == timezone.localdate():
        return f"{local:%H:%M:%S}"
    return f"{local:%b %d %H:%M}"


def _replay_summary(results: list[ReplayResult]) -> tuple[str, int]:
    """One message for a replay action, and its level.

    The counts per result, in Result's order, then the first failures by key with the
    start of their error. Success when nothing failed or was skipped, error when every
    event failed, a warning otherwise.
    """
    counts = Counter(r.result for r in results)
    summary = ", ".join(f"{counts[name]} {name}" for name in Result if counts[name])
    message = ngettext(
        "Replayed %(count)d failed event: %(summary)s.",
        "Replayed %(count)d failed events: %(summary)s.",
        len(results),
    ) % {"count": len(results), "summary": summary}
    failures = [r for r in results if r.result == Result.FAILED]
    if not failures:
        return message, messages.WARNING if counts[Result.SKIPPED] else messages.SUCCESS
    # a message, not a report: a few keys, each with the start of its error
    listed = "; ".join(
        f"{r.source}:{r.event_key} ({r.detail[:200]})" for r in failures[:MAX_FAILURES_LISTED]
    )
    more = len(failures) - MAX_FAILURES_LISTED
    message += f" Failed: {listed}" + (f"; and {more} more." if more > 0 else ".")
    return message, messages.ERROR if len(failures) == len(results) else messages.WARNING
