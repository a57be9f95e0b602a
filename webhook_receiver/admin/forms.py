"""The admin's forms: the note an operator's action keeps (one shape, several wordings),
a destination's and a source's configuration with their write-only secrets, and the
moment a recovery starts from."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.fingerprints import secret_fingerprint
from ..core.words import duration_text
from ..outbound.encryption import SecretsUnreadable, secrets_encrypt
from ..outbound.models import WebhookDestination
from ..schemes.standard import secret_key
from ..sources.models import WebhookSource
from ..sources.operations import secrets_problem, slug_problem
from ..sources.records import record_problem
from ..watch.secrets import secrets_last_verified

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


def note_form(
    field: str, *, label: StrOrPromise, required: bool, help_text: StrOrPromise, rows: int = 3
) -> type[forms.Form]:
    """A form of one text field (a reason, a note) that an action keeps on its records."""
    note = forms.CharField(
        label=label,
        required=required,
        widget=forms.Textarea(attrs={"rows": rows, "cols": 80}),
        help_text=help_text,
    )
    return type(f"{field.capitalize()}Form", (forms.Form,), {field: note})


# failed events
ReplayForm = note_form(
    "reason",
    label=_("Reason"),
    required=False,
    help_text=_(
        "Optional: why, e.g. the fix deployed. Kept in the event's history with "
        "your name and the time."
    ),
)
DiscardEventsForm = note_form(
    "reason",
    label=_("Reason"),
    required=True,
    rows=4,
    help_text=_("Kept on each discarded event, with your name and the time."),
)
# outbox messages
RetryForm = note_form(
    "reason",
    label=_("Reason"),
    required=False,
    help_text=_(
        "Optional: why, e.g. the merchant fixed its endpoint. Kept in each "
        "message's history with your name and the time."
    ),
)
DiscardMessagesForm = note_form(
    "reason",
    label=_("Reason"),
    required=True,
    rows=4,
    help_text=_("Kept on each discarded message, with your name and the time."),
)
# repair items
NoteForm = note_form(
    "note",
    label=_("Note"),
    required=False,
    help_text=_("Why: kept in each item's history, with your name and the time."),
)
RequiredNoteForm = note_form(
    "note",
    label=_("Note"),
    required=True,
    help_text=_("Required: why the item needs no repair, or how it was repaired elsewhere."),
)


# --- destinations --------------------------------------------------------------------


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
        label=_("URL"),
        max_length=2000,
        assume_scheme="https",
        widget=forms.URLInput(attrs={"class": "vURLField"}),
    )
    event_types = forms.CharField(
        label=_("Event types"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            "One per line (or comma-separated), e.g. order.paid. None: it is sent nothing."
        ),
    )
    keep_secrets = forms.MultipleChoiceField(
        label=_("Current secrets"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("Untick a secret to stop signing with it (the end of a rotation)."),
    )
    new_secrets = forms.CharField(
        label=_("Add secrets"),
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 2, "cols": 60, "autocomplete": "off"}),
        help_text=_(
            "One per line, whsec_ followed by base64. During a rotation every secret "
            "kept or added signs each request. Secrets are never shown again, not even when "
            "the form comes back with an error: type them again then."
        ),
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
            "enabled": _(
                "Untick to pause it: its messages wait, and are sent once it is enabled again."
            ),
            "rate_count": _(
                "Requests started per the interval in seconds, refilled "
                "continuously, at most the burst at once."
            ),
            "max_in_flight": _("Requests in flight at once, across every worker."),
            "max_attempts": _(
                "Failed attempts before a message is failed for an operator "
                "(a 429 or 503 with Retry-After does not count)."
            ),
            "breaker_threshold": _(
                "Consecutive failures that pause it for the cool-down; then one probe decides."
            ),
            "replay_horizon_days": _(
                "How long the receiving end remembers a key: delivered "
                "messages are kept at least this long."
            ),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.instance.secrets if self.instance.pk else []
        if "keep_secrets" in self.fields:
            keep_field = cast(forms.MultipleChoiceField, self.fields["keep_secrets"])
            keep_field.choices = [(secret_fingerprint(s), secret_label(s)) for s in current]
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
                    gettext(
                        "Line %(line)d is not a Standard Webhooks secret: whsec_ followed by "
                        "base64."
                    )
                    % {"line": n}
                ) from None
        return secrets

    def clean(self) -> dict[str, Any]:
        # ModelForm's clean() returns its cleaned_data (the stubs allow an override's None)
        cleaned = cast(dict[str, Any], super().clean())
        keep = set(cleaned.get("keep_secrets") or [])
        current = self.instance.secrets if self.instance.pk else []
        kept = [s for s in current if secret_fingerprint(s) in keep]
        added = [s for s in cleaned.get("new_secrets") or [] if s not in kept]
        secrets = added + kept
        if not secrets:
            raise forms.ValidationError(
                gettext(
                    "A destination needs at least one secret: every request it is sent is signed."
                )
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
        label=_("Failed since"),
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["since"].help_text = gettext(
            "In %(time_zone)s. Every failed message whose last attempt started at or after "
            "this time is sent again. Filled in: the last successful delivery."
        ) % {"time_zone": timezone.get_current_timezone_name()}


# --- sources -------------------------------------------------------------------------


class SourceForm(forms.ModelForm):
    """A source record's configuration. Its secrets are write-only: the form lists each
    current one by fingerprint (with the last request it verified), to keep or to remove,
    and takes new ones, which verify beside those kept (a rotation)."""

    keep_secrets = forms.MultipleChoiceField(
        label=_("Current secrets"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_(
            "By fingerprint, with the last request each verified. Untick the old one once "
            "it verifies nothing any more (the end of a rotation)."
        ),
    )
    new_secrets = forms.CharField(
        label=_("Add secrets"),
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 2, "cols": 60, "autocomplete": "off"}),
        help_text=_(
            "One per line, exactly as the sender shows it. Every secret kept or added "
            "verifies requests. Secrets are never shown again, not even when the form comes "
            "back with an error: type them again then."
        ),
    )

    class Meta:
        model = WebhookSource
        fields = (
            "slug",
            "scheme",
            "enabled",
            "tolerance_seconds",
            "max_body_bytes",
            "silence_after_seconds",
            "active_days",
            "active_start",
            "active_end",
            "active_time_zone",
        )
        help_texts = {
            "slug": _("Senders post to /webhooks/<slug>/. A slug of the settings cannot be used."),
            "enabled": _(
                "Untick to refuse its requests exactly as an unknown slug's (404), each audited."
            ),
            "silence_after_seconds": _(
                "No accepted event for this long opens a silence alert; empty or 0: never."
            ),
            "active_days": _("When silence is unexpected, e.g. mon-fri; empty: every day."),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.instance.secrets if self.instance.pk else []
        if "keep_secrets" in self.fields:
            last = secrets_last_verified(self.instance.slug, current)
            keep_field = cast(forms.MultipleChoiceField, self.fields["keep_secrets"])
            keep_field.choices = [
                (fp, _fingerprint_label(fp, last.get(fp)))
                for fp in (secret_fingerprint(s) for s in current)
            ]
            self.initial.setdefault("keep_secrets", [secret_fingerprint(s) for s in current])

    def clean_slug(self) -> str:
        slug = self.cleaned_data["slug"]
        problem = slug_problem(slug)
        if problem:
            raise forms.ValidationError(problem)
        return slug

    def clean_new_secrets(self) -> list[str]:
        return (self.cleaned_data.get("new_secrets") or "").split()

    def clean(self) -> dict[str, Any]:
        cleaned = cast(dict[str, Any], super().clean())
        keep = set(cleaned.get("keep_secrets") or [])
        current = self.instance.secrets if self.instance.pk else []
        kept = [s for s in current if secret_fingerprint(s) in keep]
        added = [s for s in cleaned.get("new_secrets") or [] if s not in kept]
        secrets = kept + added
        problem = None
        if not secrets:
            problem = gettext("A source needs at least one secret: it verifies every request.")
        elif "scheme" in cleaned:
            # a new secret's problem names its line, never the secret
            problem = secrets_problem(cleaned["scheme"], added)
            if problem:
                problem = gettext("New secrets: %(problem)s.") % {"problem": problem}
            problem = problem or secrets_problem(cleaned["scheme"], kept)
        if problem:
            raise forms.ValidationError(problem)
        try:
            secrets_encrypt(secrets)  # as saving will: with no key set, say so here
        except SecretsUnreadable as exc:
            raise forms.ValidationError(str(exc)) from None
        self.instance.secrets = secrets
        if "slug" in cleaned and "scheme" in cleaned:
            problem = record_problem(self.instance)
            if problem:
                raise forms.ValidationError(problem)
        return cleaned


def _fingerprint_label(fingerprint: str, last: Any) -> str:
    if last is None:
        return gettext("%(fingerprint)s: verified no request in the audit records kept") % {
            "fingerprint": fingerprint
        }
    return gettext("%(fingerprint)s: last verified a request %(ago)s ago (%(time)s)") % {
        "fingerprint": fingerprint,
        "ago": duration_text(timezone.now() - last),
        "time": timezone.localtime(last).strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
