"""FailedEvent: the one admin with operator actions, replay and discard.

Each action sits behind a permission of its own and goes through its service; the
discard form and the replay message are here with them. The detail page offers both
for its one event: its buttons open the same confirmation pages, and run the same code,
as the list's actions.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext, ngettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from ..inbound.failures import ReplayResult, failed_event_discard, failed_event_replay
from ..inbound.models import FailedEvent, FailureStatus, Result
from .base import ObjectButton, ObjectButtons, ReadOnlyAdmin, StoredEventDisplay, custom_permission
from .cells import (
    compact_time,
    history_html,
    stacked_lines,
    trace_link,
    trace_url,
    wrap_words,
)
from .confirm import Confirmation, Selection, confirm_then_act, report_changed
from .forms import DiscardEventsForm, ReplayForm

MAX_FAILURES_LISTED = 5
# the list shows the start of the last error; its title holds the whole of it
LAST_ERROR_CHARS = 80
LAST_ERROR_TITLE_CHARS = 2000
# which statuses each action changes: a resolved event has nothing to replay (it would
# answer duplicate), and discard leaves resolved and discarded events as they are
REPLAYABLE = (FailureStatus.RETRYING, FailureStatus.DEAD, FailureStatus.DISCARDED)
DISCARDABLE = (FailureStatus.RETRYING, FailureStatus.DEAD)


def _selection_row(event: FailedEvent) -> tuple[Any, ...]:
    return (
        event.pk,
        event.source,
        event.event_key,
        event.event_type,
        event.get_status_display(),
        event.attempts,
        event.last_error_class,
    )


EVENTS = Selection(
    (
        _("id"),
        _("source"),
        _("event key"),
        _("event type"),
        _("status"),
        _("attempts"),
        _("last error"),
    ),
    _selection_row,
    status_column=4,
)
REPLAY = Confirmation(
    action="replay_selected",
    title=_("Replay failed events"),
    explanation=(
        _(
            "Replaying runs each event's stored, verified bytes through the claim now, under "
            "its original key: an event applied meanwhile answers duplicate and changes "
            "nothing. A replay that fails again adds an attempt to the event's error history. "
            "Your name and the time are kept on each event, and the reason, if you give one, in "
            "its history."
        ),
    ),
    form=ReplayForm,
    submit=ngettext_lazy("Replay %(count)d event", "Replay %(count)d events", "count"),
    selection=EVENTS,
)
DISCARD = Confirmation(
    action="discard_selected",
    title=_("Discard failed events"),
    explanation=(
        _(
            "Discarding gives up on an event: it is not retried any more, and it is deleted "
            "once its retention has passed (until then it can still be replayed by hand). Your "
            "name, the time and the reason are kept on each event. Events already resolved or "
            "discarded are left as they are."
        ),
    ),
    form=DiscardEventsForm,
    submit=ngettext_lazy("Discard %(count)d event", "Discard %(count)d events", "count"),
    selection=EVENTS,
    applies=DISCARDABLE,
)


@admin.register(FailedEvent)
class FailedEventAdmin(ObjectButtons, StoredEventDisplay, ReadOnlyAdmin):
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
    fieldsets = (
        (
            None,
            {
                "fields": (
                    *StoredEventDisplay.event_fields,
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
            _("Operator"),
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
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    def get_queryset(self, request: HttpRequest) -> QuerySet[FailedEvent]:
        # The list needs none of the bulky columns; the detail page loads them on use.
        return super().get_queryset(request).defer("body", "headers", "errors")

    # --- permissions: the two custom ones from FailedEvent.Meta.permissions ----------

    has_replay_permission = custom_permission("replay")
    has_discard_permission = custom_permission("discard")
    # --- list and detail ---------------------------------------------------------------

    @admin.display(description=_("event key"), ordering="event_key")
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

    @admin.display(description=_("event type"), ordering="event_type")
    def type_name(self, obj: FailedEvent) -> str:
        return wrap_words(obj.event_type)

    @admin.display(description=_("status"), ordering="status")
    def state(self, obj: FailedEvent) -> str:
        """The status, then the attempts and when the last one failed, then (retrying)
        when the next one is due."""
        attempts = ngettext("%d attempt", "%d attempts", obj.attempts) % obj.attempts
        lines: list[tuple[str, str, datetime | None]] = [(obj.get_status_display(), "", None)]
        lines.append((attempts, "wr-under", None))
        lines.append((f"last {compact_time(obj.last_attempt_at)}", "wr-under", obj.last_attempt_at))
        if obj.next_attempt_at is not None:
            when = f"next {compact_time(obj.next_attempt_at)}"
            lines.append((when, "wr-under", obj.next_attempt_at))
        return stacked_lines(lines)

    @admin.display(description=_("last error"), ordering="last_error_class")
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

    @admin.display(description=_("errors, oldest first"))
    def error_history(self, obj: FailedEvent) -> str:
        entries = obj.errors if isinstance(obj.errors, list) else []
        return history_html(
            [{**e, "per_field": field_errors_html(e.get("fields"))} for e in entries
             if isinstance(e, dict)],
            '<div style="margin-bottom: 1em">'
            "<p><strong>Attempt {}</strong> at {}: {} ({})</p>"
            "<p><code>{}</code>: {}</p>{}"
            '<pre style="white-space: pre-wrap; margin: 0">{}</pre>'
            "</div>",
            ("attempt", "at", "trigger", "kind", "exception", "message", "per_field", "traceback"),
            missing="?",
        )  # fmt: skip

    # --- the detail page's Replay and Discard buttons (base.ObjectButtons) ---------------

    object_noun = _("event")
    object_buttons = {
        "replay": ObjectButton("replay_confirmed", REPLAYABLE, _("replayed"), _("Replay…")),
        "discard": ObjectButton(
            "discard_selected", DISCARDABLE, _("discarded"), _("Discard…"), "stop"
        ),
    }

    def button_context(self, request: HttpRequest, failed: FailedEvent) -> dict[str, Any]:
        return {
            "trace_url": trace_url(failed.source, failed.event_key) if failed.event_key else None
        }

    def replay_confirmed(
        self, request: HttpRequest, queryset: QuerySet[FailedEvent]
    ) -> TemplateResponse | None:
        """The detail page's Replay: a confirmation page with an optional reason (the
        list's action replays at once), then the same replay."""
        return confirm_then_act(self, request, queryset.order_by("id"), REPLAY, self._replay)

    # --- actions -----------------------------------------------------------------------

    @admin.action(description=_("Replay selected failed events now"), permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> None:
        events = list(queryset.order_by("id").only("id", "source", "event_key", "status"))
        self._replay(request, events, "")

    def _replay(self, request: HttpRequest, events: list[FailedEvent], reason: str) -> None:
        """Replay each event now, through its service; the admin's history keeps who, the
        result and the reason."""
        actor = request.user.get_username()
        reason = reason.strip()
        results: list[ReplayResult] = []
        for failed in events:
            result = failed_event_replay(failed_id=failed.pk, actor=actor)
            results.append(result)
            if result.result != Result.SKIPPED:
                note = f"Replayed: {result.result}" + (f". Reason: {reason}" if reason else "")
                self.log_change(request, failed, note)
        if not results:
            self.message_user(request, gettext("Nothing to replay."), messages.WARNING)
            return
        self.message_user(request, *_replay_summary(results))

    @admin.action(description=_("Discard selected failed events…"), permissions=["discard"])
    def discard_selected(
        self, request: HttpRequest, queryset: QuerySet[FailedEvent]
    ) -> TemplateResponse | None:
        return confirm_then_act(self, request, queryset.order_by("id"), DISCARD, self._discard)

    def _discard(self, request: HttpRequest, events: list[FailedEvent], reason: str) -> None:
        actor = request.user.get_username()
        discarded = 0
        for failed in events:
            if failed_event_discard(failed_id=failed.pk, actor=actor, reason=reason):
                discarded += 1
                self.log_change(request, failed, f"Discarded: {reason}")
        report_changed(
            self,
            request,
            ngettext_lazy(
                "Discarded %(count)d failed event.", "Discarded %(count)d failed events.", "count"
            ),
            changed=discarded,
            selected=len(events),
            why_left=(gettext("already resolved or discarded"),) * 2,
        )


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
    if more > 0:
        message += " " + gettext("Failed: %(listed)s; and %(more)d more.") % {
            "listed": listed,
            "more": more,
        }
    else:
        message += " " + gettext("Failed: %(listed)s.") % {"listed": listed}
    return message, messages.ERROR if len(failures) == len(results) else messages.WARNING


def field_errors_html(fields: Any) -> str:
    """An invalid payload's errors, one field a line (the handler's serializer's words);
    "" for an error that is not about fields."""
    if not isinstance(fields, dict) or not fields:
        return ""
    rows = (
        (path, " ".join(str(m) for m in found) if isinstance(found, list) else str(found))
        for path, found in fields.items()
    )
    return format_html(
        '<ul style="margin: 0 0 0.5em 1.5em">{}</ul>',
        format_html_join("", "<li><code>{}</code>: {}</li>", rows),
    )
