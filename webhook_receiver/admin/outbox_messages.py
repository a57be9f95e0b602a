"""The outbox's messages: records, read-only like the receive path's, with two actions,
**Retry now** and **Discard**, each behind a permission of its own
(``retry_outboxmessage``, ``discard_outboxmessage``), each through a confirmation page,
from the list or from a message's page. The admin only calls the services of
``outbound/operations.py``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from ..outbound.breaker import destination_breaker
from ..outbound.models import MessageStatus, OutboxMessage, WebhookDestination
from ..outbound.operations import DISCARDABLE, RETRYABLE, message_discard, message_retry_now
from ..outbound.tenancy import EVERY_TENANT
from ..presentation import display
from ..presentation.admin_links import admin_url
from .answers import HIDDEN_TWINS, AnswerFields
from .base import ObjectButton, ObjectButtons, ReadOnlyAdmin, custom_permission
from .cells import (
    compact_time,
    full_time,
    moment_cell,
    pre,
    stacked_lines,
    trace_link,
    trace_url,
    wrap_words,
)
from .confirm import Confirmation, Selection, confirm_then_act, report_changed
from .forms import DiscardMessagesForm, RetryForm

METADATA_NOTE = _(
    "How the payload was made (a prompt's version, token usage): kept beside the message, "
    "never sent, and not part of its identity."
)


def short_status(status: str) -> str:
    """ "Sending", of "Sending (claimed by a relay)": narrow enough for the list."""
    return MessageStatus(status).label.split(" (")[0]


def _selection_row(m: OutboxMessage) -> tuple[Any, ...]:
    """A message as a confirmation page lists it."""
    code = m.last_status_code
    answer = f"HTTP {code}" if code else Truncator(m.last_error).chars(60) or "-"
    return (m.key, m.destination.name, m.event_type, m.status, m.attempts, answer)


MESSAGES = Selection(
    (_("key"), _("destination"), _("event type"), _("status"), _("attempts"), _("last answer")),
    _selection_row,
    status_column=3,
)
RETRY = Confirmation(
    action="retry_now_selected",
    title=_("Retry outbox messages now"),
    explanation=(
        _(
            "Each failed or pending message is sent again as soon as its destination allows: it "
            "becomes pending now, and its retry budget starts again (its failures go back to 0), "
            "so it gets the destination's whole retry policy once more. It keeps its key, so the "
            "destination can tell a message it already has. A destination whose breaker is open "
            "sends when the cool-down ends, and a disabled one not at all. Delivered, sending and "
            "discarded messages are left as they are. Your name, the time and the reason are kept "
            "in each message's history."
        ),
    ),
    form=RetryForm,
    submit=ngettext_lazy("Retry %(count)d message now", "Retry %(count)d messages now", "count"),
    selection=MESSAGES,
    applies=RETRYABLE,
)
DISCARD = Confirmation(
    action="discard_selected",
    title=_("Discard outbox messages"),
    explanation=(
        _(
            "Discarding is final: a discarded message is never sent, and it cannot be retried. A "
            "message queued after it under the same ordering key is no longer held back by it. "
            "Your name and the reason are kept on each message, and the time in its history. "
            "Delivered, sending and already discarded messages are left as they are."
        ),
    ),
    form=DiscardMessagesForm,
    submit=ngettext_lazy("Discard %(count)d message", "Discard %(count)d messages", "count"),
    selection=MESSAGES,
    applies=DISCARDABLE,
)


class DestinationFilter(admin.RelatedFieldListFilter):
    """The messages' filter by destination, from the names alone: a destination's secrets
    are decrypted as it is read, and the filter needs none of them."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list:
        return list(WebhookDestination.objects.order_by("name").values_list("pk", "name"))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(AnswerFields, ObjectButtons, ReadOnlyAdmin):
    """The outbox's messages: look, retry now, or discard with a reason. The answers'
    fields are AnswerFields', shown to staff who may change the destination."""

    # Fits 1400 px beside the admin's sidebar and the filters without sideways scrolling
    # (change_list.html fixes the columns' widths): the ordering key and the trace link
    # sit under the key, the attempts and the next attempt under the status.
    list_display = ("message", "destination_name", "type_name", "state", "last_answer", "created")
    list_display_links = None
    list_filter = (("destination", DestinationFilter), "status", "event_type")
    # exact, case-sensitive values: see get_search_results
    search_fields = ("key__exact", "ordering_key__exact")
    search_help_text = _("An exact message key or ordering key.")
    # the table grows by millions: no count of all of it on every page
    show_full_result_count = False
    actions = ["retry_now_selected", "discard_selected"]
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "destination_link",
                    "key",
                    "status",
                    "event_type",
                    "ordering_key",
                    "attempts",
                    "retry_budget",
                    "next_attempt",
                    "created_exactly",
                    "last_answer_full",
                )
            },
        ),
        (_("Origin"), {"fields": ("origin",)}),
        (_("Operator"), {"fields": ("discarded_by", "discarded_at", "discard_reason")}),
        (_("Attempts, oldest first"), {"fields": ("attempt_history",)}),
        (_("Metadata"), {"fields": ("pretty_metadata",), "description": METADATA_NOTE}),
        (_("Payload"), {"fields": ("pretty_payload",)}),
    )
    readonly_fields = (*flatten_fieldsets(fieldsets), *HIDDEN_TWINS.values())

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        # the list needs none of the payload nor the metadata (the detail page loads them
        # on use), and no page of messages needs their destination's secrets, decrypted
        # as they are read
        queryset = super().get_queryset(request).select_related("destination")
        return queryset.defer("payload", "metadata", "destination__secrets")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage], search_term: str
    ) -> tuple[QuerySet[OutboxMessage], bool]:
        """An exact key or ordering key. Both are indexed after the destination
        ((destination, key) unique, (destination, ordering_key, id)), so the search names
        every destination: PostgreSQL then looks each one up in the index instead of
        reading the table (it has no skip scan before version 18). Destinations are few."""
        term = search_term.strip()
        if not term:
            return queryset, False
        every = list(WebhookDestination.objects.values_list("pk", flat=True))
        by_key = Q(destination_id__in=every, key=term)
        by_ordering_key = Q(destination_id__in=every, ordering_key=term)
        return queryset.filter(by_key | by_ordering_key), False

    # --- permissions: the two custom ones from OutboxMessage.Meta.permissions ----------

    has_retry_permission = custom_permission("retry")
    has_discard_permission = custom_permission("discard")
    # --- the list ------------------------------------------------------------------------

    @admin.display(description=_("key"), ordering="id")
    def message(self, obj: OutboxMessage) -> str:
        under: list[str] = []
        if obj.ordering_key:
            under.append(
                format_html(gettext("ordering key {key}"), key=wrap_words(obj.ordering_key))
            )
        if obj.origin_event_key:
            under.append(trace_link(obj.origin_source, obj.origin_event_key))
        return format_html(
            '<a href="{}" class="wr-key">{}</a>{}',
            admin_url(OutboxMessage, "change", quote(obj.pk)),
            wrap_words(obj.key),
            format_html('<span class="wr-under">{}</span>', mark_safe(" · ".join(under)))
            if under
            else "",
        )

    @admin.display(description=_("destination"), ordering="destination__name")
    def destination_name(self, obj: OutboxMessage) -> str:
        return obj.destination.name

    @admin.display(description=_("event type"), ordering="event_type")
    def type_name(self, obj: OutboxMessage) -> str:
        return wrap_words(obj.event_type)

    @admin.display(description=_("status"), ordering="status")
    def state(self, obj: OutboxMessage) -> str:
        """The status, then the attempts, then when the next is due (pending), the lease
        ends (sending) or it was delivered."""
        attempts = ngettext("%d attempt", "%d attempts", obj.attempts) % obj.attempts
        lines: list[tuple[str, str, datetime | None]] = [
            (short_status(obj.status), f"wr-status wr-{obj.status}", None)
        ]
        lines.append((attempts, "wr-under", None))
        if obj.status == MessageStatus.PENDING:
            next_at = gettext("next %(time)s") % {"time": compact_time(obj.next_attempt_at)}
            lines.append((next_at, "wr-under", obj.next_attempt_at))
        elif obj.status == MessageStatus.SENDING and obj.lease_until:
            lease = gettext("lease %(time)s") % {"time": compact_time(obj.lease_until)}
            lines.append((lease, "wr-under", obj.lease_until))
        elif obj.status == MessageStatus.DELIVERED and obj.delivered_at:
            at = gettext("at %(time)s") % {"time": compact_time(obj.delivered_at)}
            lines.append((at, "wr-under", obj.delivered_at))
        return stacked_lines(lines)

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: OutboxMessage) -> str:
        return moment_cell(obj.created_at)

    # --- the detail page -----------------------------------------------------------------

    @admin.display(description=_("destination"))
    def destination_link(self, obj: OutboxMessage) -> str:
        dest = obj.destination
        return format_html(
            '<a href="{}">{}</a> ({})',
            admin_url(WebhookDestination, "change", quote(dest.pk)),
            dest.name,
            display.url_masked(dest.url),
        )

    @admin.display(description=_("next attempt"))
    def next_attempt(self, obj: OutboxMessage) -> str:
        """What happens next, in words: a closed message's next_attempt_at is when it
        closed, not a time anything will happen."""
        at = full_time(obj.next_attempt_at)
        text = _("none: discarded at %(time)s")
        if obj.status == MessageStatus.PENDING:
            text = _("at %(time)s, or later if the destination's limits or breaker hold it")
        elif obj.status == MessageStatus.SENDING:
            at = full_time(obj.lease_until) if obj.lease_until else "-"
            text = _("being sent by a worker; if that worker dies, tried again after %(time)s")
        elif obj.status == MessageStatus.FAILED:
            text = _("none: failed at %(time)s, waiting for an operator (retry now or discard)")
        elif obj.status == MessageStatus.DELIVERED:
            at = full_time(obj.delivered_at) if obj.delivered_at else at
            text = _("none: delivered at %(time)s")
        return text % {"time": at}

    @admin.display(description=_("created"))
    def created_exactly(self, obj: OutboxMessage) -> str:
        return full_time(obj.created_at)

    @admin.display(description=_("retry budget"))
    def retry_budget(self, obj: OutboxMessage) -> str:
        budget = {"spent": obj.failures, "budget": obj.destination.max_attempts}
        return gettext("%(spent)d of %(budget)d failures spent") % budget

    @admin.display(description=_("origin"))
    def origin(self, obj: OutboxMessage) -> str:
        if not obj.origin_event_key:
            return gettext("- (enqueued outside an inbound event's handler)")
        return format_html(
            gettext("{source} event {key} · {trace}"),
            source=obj.origin_source,
            key=obj.origin_event_key,
            trace=trace_link(obj.origin_source, obj.origin_event_key),
        )

    @admin.display(description=_("payload"))
    def pretty_payload(self, obj: OutboxMessage) -> str:
        return pre(display.json_text(obj.payload))

    @admin.display(description=_("metadata"))
    def pretty_metadata(self, obj: OutboxMessage) -> str:
        return pre(display.json_text(obj.metadata)) if obj.metadata else "-"

    # --- the detail page's Retry now and Discard buttons (base.ObjectButtons) ----------

    object_noun = _("message")
    object_buttons = {
        "retry": ObjectButton("retry_now_selected", RETRYABLE, _("retried"), _("Retry now…")),
        "discard": ObjectButton(
            "discard_selected", DISCARDABLE, _("discarded"), _("Discard…"), "stop"
        ),
    }

    def button_context(self, request: HttpRequest, message: OutboxMessage) -> dict[str, Any]:
        key = message.origin_event_key
        return {"trace_url": trace_url(message.origin_source, key) if key else None}

    def object_status_text(self, message: OutboxMessage) -> str:
        return short_status(message.status)

    # --- actions -------------------------------------------------------------------------

    @admin.action(description=_("Retry selected messages now…"), permissions=["retry"])
    def retry_now_selected(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> TemplateResponse | None:
        return confirm_then_act(self, request, queryset.order_by("id"), RETRY, self._retry)

    def _retry(self, request: HttpRequest, selected: list[OutboxMessage], reason: str) -> None:
        by = request.user.get_username()
        changed = message_retry_now(scope=EVERY_TENANT, message_ids=[m.pk for m in selected], by=by)
        reason = reason.strip()
        self._log(request, changed, "Retried now" + (f". Reason: {reason}" if reason else ""))
        self._report(
            request,
            ngettext_lazy(
                "Queued %(count)d message to send now.",
                "Queued %(count)d messages to send now.",
                "count",
            ),
            selected,
            changed,
        )
        self._warn_held_back(request, selected, changed)

    @admin.action(description=_("Discard selected messages…"), permissions=["discard"])
    def discard_selected(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> TemplateResponse | None:
        return confirm_then_act(self, request, queryset.order_by("id"), DISCARD, self._discard)

    def _discard(self, request: HttpRequest, selected: list[OutboxMessage], reason: str) -> None:
        changed = message_discard(
            scope=EVERY_TENANT,
            message_ids=[m.pk for m in selected],
            by=request.user.get_username(),
            reason=reason,
        )
        self._log(request, changed, f"Discarded: {reason.strip()}")
        self._report(
            request,
            ngettext_lazy("Discarded %(count)d message.", "Discarded %(count)d messages.", "count"),
            selected,
            changed,
        )

    def _log(self, request: HttpRequest, changed: list[int], note: str) -> None:
        """One admin history entry per changed message: who, when, what and why."""
        if changed:
            LogEntry.objects.log_actions(
                # the admin's views let only a logged-in user in: the pk is never None
                user_id=cast(int, request.user.pk),
                queryset=OutboxMessage.objects.filter(pk__in=changed).only("id", "key", "status"),
                action_flag=CHANGE,
                change_message=note,
            )

    def _report(
        self, request: HttpRequest, done: Any, selected: list[Any], changed: list[int]
    ) -> None:
        why = (gettext("its status does not allow it"), gettext("their status does not allow it"))
        report_changed(
            self, request, done, changed=len(changed), selected=len(selected), why_left=why
        )

    def _warn_held_back(
        self, request: HttpRequest, selected: list[OutboxMessage], changed: list[int]
    ) -> None:
        """Say so when a destination will not send the retried messages yet."""
        now = timezone.now()
        ids = set(changed)
        destinations = {m.destination_id: m.destination for m in selected if m.pk in ids}
        for dest in sorted(destinations.values(), key=lambda d: d.name):
            dest.refresh_from_db()
            breaker = destination_breaker(dest, now=now)
            held = {"destination": dest.name}
            if not dest.enabled:
                why = _("%(destination)s is disabled: its messages wait until it is enabled.")
            elif breaker.state == "open" and breaker.until is not None:
                held["time"] = full_time(breaker.until)
                why = _(
                    "%(destination)s's breaker is open until %(time)s: its messages go then "
                    "(a recovery job of its failed messages ends the pause)."
                )
            else:
                continue
            self.message_user(request, why % held, messages.WARNING)
