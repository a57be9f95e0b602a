"""The outbox's operating surface: messages and destinations.

- Messages are records, read-only like the receive path's, with two actions, **Retry
  now** and **Discard**, each behind a permission of its own
  (``retry_outboxmessage``, ``discard_outboxmessage``), each through a confirmation
  page, from the list or from a message's page.
- Destinations are configuration: added and changed here (or with
  ``manage.py webhook_destination``), never deleted (disable one instead), listed with
  their health, and recovered with **Recover since…** once a merchant has fixed its
  endpoint. Their secrets are never shown: the list counts them, the form lets you keep
  or drop each (known by its last four characters) and add new ones.

The admin only calls the services of ``outbound/operations.py``.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import ngettext

from ..core import display
from ..core.words import duration_text
from ..outbound.breaker import destination_breaker
from ..outbound.encryption import SecretsUnreadable, secrets_encrypt
from ..outbound.models import DeliveryAttempt, MessageStatus, OutboxMessage, WebhookDestination
from ..outbound.operations import (
    DISCARDABLE,
    RETRYABLE,
    destination_recover_since,
    message_discard,
    message_retry_now,
)
from ..outbound.selectors import destinations_with_health
from ..schemes.standard import secret_key
from .base import (
    ObjectButton,
    ObjectButtons,
    ReadOnlyAdmin,
    compact_time,
    full_time,
    pre,
    stacked_lines,
    trace_link,
    trace_url,
    wrap_words,
)

# the list shows the start of the last answer; its title holds the whole of it
LAST_ANSWER_CHARS = 70
LAST_ANSWER_TITLE_CHARS = 2000
# a message's page shows its newest attempts (a destination pacing us with 429s can
# make many: they do not spend the retry budget)
ATTEMPTS_SHOWN = 100
# a confirmation page lists this many of the selection; the action takes them all
SELECTION_SHOWN = 100
SHORT_STATUS = {
    MessageStatus.PENDING: "Pending",
    MessageStatus.SENDING: "Sending",
    MessageStatus.DELIVERED: "Delivered",
    MessageStatus.FAILED: "Failed",
    MessageStatus.DISCARDED: "Discarded",
}


def _admin_url(model: type, view: str, *args: Any) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def _moment(moment: datetime | None, empty: str = "-") -> str:
    """A compact time, the full one in its title."""
    if moment is None:
        return empty
    return format_html('<span title="{}">{}</span>', full_time(moment), compact_time(moment))


def last_answer_text(status_code: int | None, error: str) -> str:
    """ "HTTP 503: upstream unavailable" or "ConnectError: …": what the destination last
    answered, or why it could not."""
    text = " ".join(error.split())
    if status_code is not None:
        return f"HTTP {status_code}: {text}" if text else f"HTTP {status_code}"
    return text


# --- messages ------------------------------------------------------------------------


class RetryForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Optional: why, e.g. the merchant fixed its endpoint. Kept in each "
        "message's history with your name and the time.",
    )


class DiscardForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="Kept on each discarded message, with your name and the time.",
    )


class DestinationFilter(admin.RelatedFieldListFilter):
    """The messages' filter by destination, from the names alone: a destination's secrets
    are decrypted as it is read, and the filter needs none of them."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: Any) -> list:
        return list(WebhookDestination.objects.order_by("name").values_list("pk", "name"))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ObjectButtons, ReadOnlyAdmin):
    """The outbox's messages: look, retry now, or discard with a reason."""

    # Fits 1400 px beside the admin's sidebar and the filters without sideways scrolling
    # (change_list.html fixes the columns' widths): the ordering key and the trace link
    # sit under the key, the attempts and the next attempt under the status.
    list_display = ("message", "destination_name", "type_name", "state", "last_answer", "created")
    list_display_links = None
    list_filter = (("destination", DestinationFilter), "status", "event_type")
    # exact, case-sensitive values: see get_search_results
    search_fields = ("key__exact", "ordering_key__exact")
    search_help_text = "An exact message key or ordering key."
    # the table grows by millions: no count of all of it on every page
    show_full_result_count = False
    actions = ["retry_now_selected", "discard_selected"]
    retry_confirmation_template = "admin/webhook_receiver/outboxmessage/retry_confirmation.html"
    discard_confirmation_template = "admin/webhook_receiver/outboxmessage/discard_confirmation.html"
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
        ("Origin", {"fields": ("origin",)}),
        ("Operator", {"fields": ("discarded_by", "discarded_at", "discard_reason")}),
        ("Attempts, oldest first", {"fields": ("attempt_history",)}),
        ("Payload", {"fields": ("pretty_payload",)}),
    )
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        # the list needs none of the payload (the detail page loads it on use), and no
        # page of messages needs their destination's secrets, decrypted as they are read
        queryset = super().get_queryset(request).select_related("destination")
        return queryset.defer("payload", "destination__secrets")

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

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "retry")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self.has_custom_permission(request, "discard")

    # --- the list ------------------------------------------------------------------------

    @admin.display(description="key", ordering="id")
    def message(self, obj: OutboxMessage) -> str:
        under = []
        if obj.ordering_key:
            under.append(format_html("ordering key {}", wrap_words(obj.ordering_key)))
        if obj.origin_event_key:
            under.append(trace_link(obj.origin_source, obj.origin_event_key))
        return format_html(
            '<a href="{}" class="wr-key">{}</a>{}',
            _admin_url(OutboxMessage, "change", quote(obj.pk)),
            wrap_words(obj.key),
            format_html('<span class="wr-under">{}</span>', mark_safe(" · ".join(under)))
            if under
            else "",
        )

    @admin.display(description="destination", ordering="destination__name")
    def destination_name(self, obj: OutboxMessage) -> str:
        return obj.destination.name

    @admin.display(description="event type", ordering="event_type")
    def type_name(self, obj: OutboxMessage) -> str:
        return wrap_words(obj.event_type)

    @admin.display(description="status", ordering="status")
    def state(self, obj: OutboxMessage) -> str:
        """The status, then the attempts, then when the next is due (pending), the lease
        ends (sending) or it was delivered."""
        attempts = ngettext("%d attempt", "%d attempts", obj.attempts) % obj.attempts
        lines = [(SHORT_STATUS.get(obj.status, obj.status), f"wr-status wr-{obj.status}", None)]
        lines.append((attempts, "wr-under", None))
        if obj.status == MessageStatus.PENDING:
            lines.append(
                (f"next {compact_time(obj.next_attempt_at)}", "wr-under", obj.next_attempt_at)
            )
        elif obj.status == MessageStatus.SENDING and obj.lease_until:
            lines.append((f"lease {compact_time(obj.lease_until)}", "wr-under", obj.lease_until))
        elif obj.status == MessageStatus.DELIVERED and obj.delivered_at:
            lines.append((f"at {compact_time(obj.delivered_at)}", "wr-under", obj.delivered_at))
        return stacked_lines(lines)

    @admin.display(description="last answer", ordering="last_status_code")
    def last_answer(self, obj: OutboxMessage) -> str:
        full = last_answer_text(obj.last_status_code, obj.last_error)
        if not full:
            return "-"
        short = full
        if len(short) > LAST_ANSWER_CHARS:
            short = short[: LAST_ANSWER_CHARS - 1].rstrip() + "…"
        return format_html('<span title="{}">{}</span>', full[:LAST_ANSWER_TITLE_CHARS], short)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: OutboxMessage) -> str:
        return _moment(obj.created_at)

    # --- the detail page -----------------------------------------------------------------

    @admin.display(description="destination")
    def destination_link(self, obj: OutboxMessage) -> str:
        dest = obj.destination
        return format_html(
            '<a href="{}">{}</a> ({})',
            _admin_url(WebhookDestination, "change", quote(dest.pk)),
            dest.name,
            dest.url,
        )

    @admin.display(description="next attempt")
    def next_attempt(self, obj: OutboxMessage) -> str:
        """What happens next, in words: a closed message's next_attempt_at is when it
        closed, not a time anything will happen."""
        at = full_time(obj.next_attempt_at)
        if obj.status == MessageStatus.PENDING:
            return f"at {at}, or later if the destination's limits or breaker hold it"
        if obj.status == MessageStatus.SENDING:
            lease = full_time(obj.lease_until) if obj.lease_until else "-"
            return f"being sent by a worker; if that worker dies, tried again after {lease}"
        if obj.status == MessageStatus.FAILED:
            return f"none: failed at {at}, waiting for an operator (retry now or discard)"
        if obj.status == MessageStatus.DELIVERED:
            delivered = full_time(obj.delivered_at) if obj.delivered_at else at
            return f"none: delivered at {delivered}"
        return f"none: discarded at {at}"

    @admin.display(description="created")
    def created_exactly(self, obj: OutboxMessage) -> str:
        return full_time(obj.created_at)

    @admin.display(description="retry budget")
    def retry_budget(self, obj: OutboxMessage) -> str:
        return f"{obj.failures} of {obj.destination.max_attempts} failures spent"

    @admin.display(description="last answer")
    def last_answer_full(self, obj: OutboxMessage) -> str:
        return last_answer_text(obj.last_status_code, obj.last_error) or "-"

    @admin.display(description="origin")
    def origin(self, obj: OutboxMessage) -> str:
        if not obj.origin_event_key:
            return "- (enqueued outside an inbound event's handler)"
        return format_html(
            "{} event {} · {}",
            obj.origin_source,
            obj.origin_event_key,
            trace_link(obj.origin_source, obj.origin_event_key),
        )

    @admin.display(description="payload")
    def pretty_payload(self, obj: OutboxMessage) -> str:
        return pre(display.json_text(obj.payload))

    @admin.display(description="attempts")
    def attempt_history(self, obj: OutboxMessage) -> str:
        newest = list(obj.attempt_set.order_by("-number")[:ATTEMPTS_SHOWN])
        if not newest:
            return "None yet."
        earlier = obj.attempt_set.count() - len(newest) if len(newest) == ATTEMPTS_SHOWN else 0
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td><pre class="wr-excerpt">{}</pre></td><td>{}</td></tr>',
            (
                (
                    a.number,
                    full_time(a.started_at),
                    f"{a.duration_ms} ms",
                    _attempt_answer(a),
                    a.response_excerpt or "-",
                    full_time(a.next_attempt_at) if a.next_attempt_at else "-",
                )
                for a in reversed(newest)
            ),
        )
        note = (
            format_html(
                "<p>{} earlier attempts are not shown.</p>",
                earlier,
            )
            if earlier
            else ""
        )
        return format_html(
            '{}<table class="wr-attempts"><thead><tr><th>#</th><th>started</th>'
            "<th>took</th><th>answer</th><th>response</th><th>next eligible</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            note,
            rows,
        )

    # --- the detail page's Retry now and Discard buttons (base.ObjectButtons) ----------

    object_noun = "message"
    object_buttons = {
        "retry": ObjectButton("retry_now_selected", RETRYABLE, "retried"),
        "discard": ObjectButton("discard_selected", DISCARDABLE, "discarded"),
    }

    def button_context(self, request: HttpRequest, message: OutboxMessage) -> dict[str, Any]:
        key = message.origin_event_key
        return {"trace_url": trace_url(message.origin_source, key) if key else None}

    def object_status_text(self, message: OutboxMessage) -> str:
        return SHORT_STATUS[message.status]

    # --- actions -------------------------------------------------------------------------

    @admin.action(description="Retry selected messages now…", permissions=["retry"])
    def retry_now_selected(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> TemplateResponse | None:
        selected = list(queryset.order_by("id"))
        if request.POST.get("post"):
            form = RetryForm(request.POST)
            if form.is_valid():
                by = request.user.get_username()
                changed = message_retry_now(message_ids=[m.pk for m in selected], by=by)
                reason = form.cleaned_data["reason"].strip()
                note = "Retried now" + (f". Reason: {reason}" if reason else "")
                self._log(request, changed, note)
                self._report(
                    request,
                    "Queued %(count)d message to send now.",
                    "Queued %(count)d messages to send now.",
                    selected,
                    changed,
                )
                self._warn_held_back(request, selected, changed)
                return None  # back to where the action was started
        else:
            form = RetryForm()
        return self._confirm(
            request,
            self.retry_confirmation_template,
            form=form,
            selected=selected,
            action_name="retry_now_selected",
            title="Retry outbox messages now",
            label=("Retry %d message now", "Retry %d messages now"),
            applicable=RETRYABLE,
        )

    @admin.action(description="Discard selected messages…", permissions=["discard"])
    def discard_selected(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> TemplateResponse | None:
        selected = list(queryset.order_by("id"))
        if request.POST.get("post"):
            form = DiscardForm(request.POST)
            if form.is_valid():
                reason = form.cleaned_data["reason"]
                changed = message_discard(
                    message_ids=[m.pk for m in selected],
                    by=request.user.get_username(),
                    reason=reason,
                )
                self._log(request, changed, f"Discarded: {reason.strip()}")
                self._report(
                    request,
                    "Discarded %(count)d message.",
                    "Discarded %(count)d messages.",
                    selected,
                    changed,
                )
                return None
        else:
            form = DiscardForm()
        return self._confirm(
            request,
            self.discard_confirmation_template,
            form=form,
            selected=selected,
            action_name="discard_selected",
            title="Discard outbox messages",
            label=("Discard %d message", "Discard %d messages"),
            applicable=DISCARDABLE,
        )

    def _confirm(
        self,
        request: HttpRequest,
        template: str,
        *,
        form: forms.Form,
        selected: list[OutboxMessage],
        action_name: str,
        title: str,
        label: tuple[str, str],
        applicable: tuple[str, ...],
    ) -> TemplateResponse:
        count = len(selected)
        return self.confirmation_page(
            request,
            template,
            form=form,
            note_field="reason",
            selected=selected,
            action_name=action_name,
            title=title,
            submit_label=ngettext(label[0], label[1], count) % count,
            shown=selected[:SELECTION_SHOWN],
            not_shown=max(0, count - SELECTION_SHOWN),
            applicable=applicable,
            untouched=sum(1 for m in selected if m.status not in applicable),
        )

    def _log(self, request: HttpRequest, changed: list[int], note: str) -> None:
        """One admin history entry per changed message: who, when, what and why."""
        if changed:
            LogEntry.objects.log_actions(
                user_id=request.user.pk,
                queryset=OutboxMessage.objects.filter(pk__in=changed).only("id", "key", "status"),
                action_flag=CHANGE,
                change_message=note,
            )

    def _report(
        self,
        request: HttpRequest,
        singular: str,
        plural: str,
        selected: list[OutboxMessage],
        changed: list[int],
    ) -> None:
        message = ngettext(singular, plural, len(changed)) % {"count": len(changed)}
        left = len(selected) - len(changed)
        if left:
            message += " " + ngettext(
                "%(count)d was left as it was (its status does not allow it).",
                "%(count)d were left as they were (their status does not allow it).",
                left,
            ) % {"count": left}
        self.message_user(request, message, messages.WARNING if left else messages.SUCCESS)

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
            if not dest.enabled:
                why = f"{dest.name} is disabled: its messages wait until it is enabled."
            elif breaker.state == "open" and breaker.until is not None:
                why = (
                    f"{dest.name}'s breaker is open until {full_time(breaker.until)}: its "
                    "messages go then (Recover since… on the destination ends the pause)."
                )
            else:
                continue
            self.message_user(request, why, messages.WARNING)


def _attempt_answer(attempt: DeliveryAttempt) -> str:
    if attempt.status_code is not None:
        return f"HTTP {attempt.status_code}"
    return attempt.error or "-"


# --- destinations --------------------------------------------------------------------


def secret_fingerprint(secret: str) -> str:
    """A stable name for a secret that reveals nothing of it: the form's checkboxes
    post this, never the secret."""
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def secret_label(secret: str) -> str:
    """ "whsec_…8ILP": the last four characters, enough to tell secrets apart."""
    return f"whsec_…{secret[-4:]}" if len(secret) > 12 else "whsec_…"


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value: a form sent back with an error does not
    echo the secrets typed into it (re-enter them)."""

    def format_value(self, value: Any) -> None:
        return None


class DestinationForm(forms.ModelForm):
    """The destination's configuration. Its secrets are write-only: the form lists each
    current one by its last four characters, to keep or to drop, and takes new ones,
    which sign alongside those kept (a rotation)."""

    url = forms.URLField(
        label="URL",
        max_length=2000,
        assume_scheme="https",
        widget=forms.URLInput(attrs={"class": "vURLField"}),
    )
    event_types = forms.CharField(
        label="Event types",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="One per line (or comma-separated), e.g. order.paid. None: it is sent nothing.",
    )
    keep_secrets = forms.MultipleChoiceField(
        label="Current secrets",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Untick a secret to stop signing with it (the end of a rotation).",
    )
    new_secrets = forms.CharField(
        label="Add secrets",
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 2, "cols": 60, "autocomplete": "off"}),
        help_text="One per line, whsec_ followed by base64. During a rotation every secret "
        "kept or added signs each request. Secrets are never shown again, not even when "
        "the form comes back with an error: type them again then.",
    )

    class Meta:
        model = WebhookDestination
        fields = (
            "name",
            "url",
            "enabled",
            "event_types",
            "rate_count",
            "rate_seconds",
            "burst",
            "max_in_flight",
            "timeout_seconds",
            "max_attempts",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "retry_after_cap_seconds",
            "breaker_threshold",
            "breaker_cooldown_seconds",
            "replay_horizon_days",
        )
        help_texts = {
            "enabled": "Untick to pause it: its messages wait, and are sent once it is "
            "enabled again.",
            "rate_count": "Requests started per the interval in seconds, refilled "
            "continuously, at most the burst at once.",
            "max_in_flight": "Requests in flight at once, across every worker.",
            "max_attempts": "Failed attempts before a message is failed for an operator "
            "(a 429 or 503 with Retry-After does not count).",
            "breaker_threshold": "Consecutive failures that pause it for the cool-down; "
            "then one probe decides.",
            "replay_horizon_days": "How long the receiving end remembers a key: delivered "
            "messages are kept at least this long.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.instance.secrets if self.instance.pk else []
        if "keep_secrets" in self.fields:
            self.fields["keep_secrets"].choices = [
                (secret_fingerprint(s), secret_label(s)) for s in current
            ]
            self.initial.setdefault("keep_secrets", [secret_fingerprint(s) for s in current])
        if "event_types" in self.fields:
            self.initial["event_types"] = "\n".join(self.instance.event_types or [])

    def clean_event_types(self) -> list[str]:
        text = self.cleaned_data.get("event_types") or ""
        return list(dict.fromkeys(t.strip() for t in re.split(r"[\s,]+", text) if t.strip()))

    def clean_new_secrets(self) -> list[str]:
        secrets = (self.cleaned_data.get("new_secrets") or "").split()
        for n, secret in enumerate(secrets, 1):
            try:
                if not secret.startswith("whsec_"):
                    raise ValueError
                secret_key(secret)
            except ValueError:
                # the message names the line, never the secret
                raise forms.ValidationError(
                    f"Line {n} is not a Standard Webhooks secret: whsec_ followed by base64."
                ) from None
        return secrets

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        keep = set(cleaned.get("keep_secrets") or [])
        current = self.instance.secrets if self.instance.pk else []
        kept = [s for s in current if secret_fingerprint(s) in keep]
        added = [s for s in cleaned.get("new_secrets") or [] if s not in kept]
        secrets = added + kept
        if not secrets:
            raise forms.ValidationError(
                "A destination needs at least one secret: every request it is sent is signed."
            )
        try:
            secrets_encrypt(secrets)  # as saving will: with no key set, say so here
        except SecretsUnreadable as exc:
            raise forms.ValidationError(str(exc)) from None
        # not a form field of the model's: set here, saved with the rest
        self.instance.secrets = secrets
        return cleaned


class RecoverForm(forms.Form):
    since = forms.DateTimeField(
        label="Failed since",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["since"].help_text = (
            f"In {timezone.get_current_timezone_name()}. Every failed message whose last "
            "attempt started at or after this time is sent again. Filled in: the last "
            "successful delivery."
        )


# the configuration an admin form saves; the limiter's and breaker's state, which the
# relay writes under the row's lock meanwhile, is never written back from a form
CONFIGURATION = (*DestinationForm.Meta.fields, "secrets", "updated_at")


@admin.register(WebhookDestination)
class WebhookDestinationAdmin(ObjectButtons, admin.ModelAdmin):
    """Destinations with their health; add, change, disable; recover since…"""

    # "Recover since…" on a destination's page: the list action on that one destination
    object_buttons = {"recover": ObjectButton("recover_since_selected", None, "recovered")}
    object_noun = "destination"

    form = DestinationForm
    list_display = (
        "destination",
        "enabled",
        "breaker",
        "backlog_figure",
        "oldest_eligible",
        "failed_figure",
        "last_success",
        "last_failure",
        "secret_count",
    )
    list_display_links = None
    actions = ["recover_since_selected"]
    recover_confirmation_template = (
        "admin/webhook_receiver/webhookdestination/recover_confirmation.html"
    )
    health_fields = (
        "breaker_state",
        "backlog_figure",
        "oldest_eligible",
        "failed_figure",
        "last_success_exactly",
        "last_failure_exactly",
    )
    # shared with the messages' admin (a method of ReadOnlyAdmin that needs no more
    # than a ModelAdmin)
    confirmation_page = ReadOnlyAdmin.confirmation_page

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple]:
        secrets = ("keep_secrets", "new_secrets") if obj is not None else ("new_secrets",)
        # the health first: what an operator opens this page for
        fieldsets: list[tuple] = [("Health", {"fields": self.health_fields})] if obj else []
        fieldsets += [
            ("Destination", {"fields": ("name", "url", "enabled", "event_types")}),
            ("Secrets", {"fields": secrets}),
            (
                "Limits",
                {
                    "fields": (
                        ("rate_count", "rate_seconds", "burst"),
                        "max_in_flight",
                        "timeout_seconds",
                    )
                },
            ),
            (
                "Retries",
                {
                    "fields": (
                        "max_attempts",
                        ("backoff_base_seconds", "backoff_cap_seconds"),
                        "retry_after_cap_seconds",
                        "replay_horizon_days",
                    )
                },
            ),
            ("Breaker", {"fields": (("breaker_threshold", "breaker_cooldown_seconds"),)}),
        ]
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # the name is how host code enqueues to it (enqueue_webhook("merchant-7", …))
        return ("name", *self.health_fields) if obj is not None else ()

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDestination]:
        return destinations_with_health(super().get_queryset(request))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # its messages are kept (PROTECT): a destination is disabled, not deleted
        return False

    def has_recover_permission(self, request: HttpRequest) -> bool:
        """Recovering sends failed messages again: the messages' retry permission."""
        return request.user.has_perm(f"{self.opts.app_label}.retry_outboxmessage")

    def save_model(self, request: HttpRequest, obj: Any, form: forms.Form, change: bool) -> None:
        if change:
            obj.save(update_fields=CONFIGURATION)
        else:
            obj.save()

    # --- the list ------------------------------------------------------------------------

    @admin.display(description="destination", ordering="name")
    def destination(self, obj: WebhookDestination) -> str:
        return format_html(
            '<a href="{}" class="wr-key">{}</a><span class="wr-under" title="{}">{}</span>',
            _admin_url(WebhookDestination, "change", quote(obj.pk)),
            obj.name,
            obj.url,
            obj.url,
        )

    @admin.display(description="breaker", ordering="paused_until")
    def breaker(self, obj: WebhookDestination) -> str:
        breaker = destination_breaker(obj)
        if breaker.state == "open" and breaker.until is not None:
            return format_html(
                '<span class="wr-line wr-open">open</span>'
                '<span class="wr-under" title="{}">until {}</span>',
                full_time(breaker.until),
                compact_time(breaker.until),
            )
        if breaker.state == "half-open":
            return mark_safe(
                '<span class="wr-line wr-half">half-open</span>'
                '<span class="wr-under">one probe at a time</span>'
            )
        if breaker.consecutive_failures:
            failures = (
                ngettext(
                    "%d failure in a row", "%d failures in a row", breaker.consecutive_failures
                )
                % breaker.consecutive_failures
            )
            return format_html(
                '<span class="wr-line">closed</span><span class="wr-under">{}</span>', failures
            )
        return "closed"

    @admin.display(description="backlog", ordering="backlog")
    def backlog_figure(self, obj: WebhookDestination) -> str:
        return self._messages_link(obj, obj.backlog, MessageStatus.PENDING, "wr-figure")

    @admin.display(description="oldest due", ordering="oldest_eligible_at")
    def oldest_eligible(self, obj: WebhookDestination) -> str:
        if obj.oldest_eligible_at is None:
            return "-"
        return format_html(
            '<span title="waiting since {}">{}</span>',
            full_time(obj.oldest_eligible_at),
            duration_text(timezone.now() - obj.oldest_eligible_at),
        )

    @admin.display(description="failed", ordering="failed_count")
    def failed_figure(self, obj: WebhookDestination) -> str:
        css = "wr-figure wr-failed" if obj.failed_count else "wr-figure"
        return self._messages_link(obj, obj.failed_count, MessageStatus.FAILED, css)

    @admin.display(description="last success", ordering="last_success_at")
    def last_success(self, obj: WebhookDestination) -> str:
        return _moment(obj.last_success_at, "never")

    @admin.display(description="last failure", ordering="last_failure_at")
    def last_failure(self, obj: WebhookDestination) -> str:
        return _moment(obj.last_failure_at, "never")

    @admin.display(description="secrets")
    def secret_count(self, obj: WebhookDestination) -> str:
        count = len(obj.secrets or [])
        return ngettext("%d secret", "%d secrets", count) % count

    def _messages_link(self, obj: WebhookDestination, count: int, status: str, css: str) -> str:
        query = urlencode({"destination__id__exact": obj.pk, "status__exact": status})
        return format_html(
            '<a class="{}" href="{}?{}">{}</a>',
            css,
            _admin_url(OutboxMessage, "changelist"),
            query,
            count,
        )

    # --- the change form -----------------------------------------------------------------

    @admin.display(description="breaker")
    def breaker_state(self, obj: WebhookDestination) -> str:
        breaker = destination_breaker(obj)
        if breaker.state == "open" and breaker.until is not None:
            return (
                f"open until {full_time(breaker.until)}, after {breaker.consecutive_failures} "
                "consecutive failures; then one probe decides"
            )
        if breaker.state == "half-open":
            return "half-open: one probe at a time decides whether it closes"
        if breaker.consecutive_failures:
            return (
                f"closed ({breaker.consecutive_failures} consecutive failures; it opens at "
                f"{obj.breaker_threshold})"
            )
        return "closed"

    @admin.display(description="last success")
    def last_success_exactly(self, obj: WebhookDestination) -> str:
        return full_time(obj.last_success_at) if obj.last_success_at else "never"

    @admin.display(description="last failure")
    def last_failure_exactly(self, obj: WebhookDestination) -> str:
        return full_time(obj.last_failure_at) if obj.last_failure_at else "never"

    # --- Recover since… ------------------------------------------------------------------

    def has_custom_permission(self, request: HttpRequest, action: str) -> bool:
        """ObjectButtons' check: the one button is Recover since…"""
        return action == "recover" and self.has_recover_permission(request)

    @admin.action(description="Recover failed messages since…", permissions=["recover"])
    def recover_since_selected(
        self, request: HttpRequest, queryset: QuerySet[WebhookDestination]
    ) -> TemplateResponse | None:
        selected = list(queryset.order_by("name"))
        if request.POST.get("post"):
            form = RecoverForm(request.POST)
            if form.is_valid():
                self._recover(request, selected, since=form.cleaned_data["since"])
                return None
        else:
            successes = [d.last_success_at for d in selected if d.last_success_at]
            form = RecoverForm(initial={"since": min(successes)} if successes else None)
        count = len(selected)
        return self.confirmation_page(
            request,
            self.recover_confirmation_template,
            form=form,
            note_field="since",
            selected=selected,
            action_name="recover_since_selected",
            title="Recover failed messages",
            submit_label=ngettext(
                "Recover %d destination's failed messages",
                "Recover %d destinations' failed messages",
                count,
            )
            % count,
        )

    def _recover(
        self, request: HttpRequest, selected: list[WebhookDestination], *, since: datetime
    ) -> None:
        by = request.user.get_username()
        when = full_time(since)
        for dest in selected:
            count = destination_recover_since(destination=dest, since=since, by=by)
            note = ngettext(
                "Recovered %(count)d failed message since %(when)s.",
                "Recovered %(count)d failed messages since %(when)s.",
                count,
            ) % {"count": count, "when": when}
            self.log_change(request, dest, note)
            text = f"{dest.name}: {note[0].lower()}{note[1:]}"
            if count and not dest.enabled:
                text += " It is disabled: they are sent once it is enabled again."
            ok = count and dest.enabled
            self.message_user(request, text, messages.SUCCESS if ok else messages.WARNING)
