"""FailedEvent: the one admin with operator actions, replay and discard.

Each action sits behind a permission of its own and goes through its service; the
discard form and the replay message are here with them.
"""

from __future__ import annotations

from collections import Counter

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.translation import ngettext

from ..models import FailedEvent, FailureStatus, Result
from ..services.failures import (
    ReplayResult,
    failed_event_discard,
    failed_event_replay,
)
from .base import ReadOnlyAdmin, StoredEventDisplay

MAX_FAILURES_LISTED = 5


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

    list_display = (
        "last_attempt_at",
        "source",
        "event_type",
        "status",
        "attempts",
        "last_error",
        "next_attempt_at",
        "event_key",
    )
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

    @admin.display(description="last error", ordering="last_error_class")
    def last_error(self, obj: FailedEvent) -> str:
        if not obj.last_error_class:
            return ""
        return format_html(
            '<span title="{}">{}</span>',
            obj.last_error_class,
            obj.last_error_class.rsplit(".", 1)[-1],
        )

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

    # --- actions -----------------------------------------------------------------------

    @admin.action(description="Replay selected failed events now", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> None:
        actor = request.user.get_username()
        results: list[ReplayResult] = []
        for failed in queryset.order_by("id").only("id", "source", "event_key", "status"):
            result = failed_event_replay(failed_id=failed.pk, actor=actor)
            results.append(result)
            if result.result != Result.SKIPPED:
                self.log_change(request, failed, f"Replayed: {result.result}")
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
