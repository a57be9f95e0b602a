"""The admin's forms: the note an operator's action keeps (one shape, several wordings),
a destination's configuration with its write-only secrets (their shared handling,
StoredSecretsForm, serves the source record's form too: source_form.py), and the moment
a recovery starts from."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.core.validators import URLValidator
from django.utils.text import format_lazy
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.encryption import SecretsUnreadable, secrets_encrypt
from ..core.fingerprints import secret_fingerprint
from ..network.egress import UrlRefused, check_url
from ..outbound.catalog import subscription_problems
from ..outbound.filters import filter_problem
from ..outbound.models import WebhookDestination
from ..outbound.signing_secrets import destination_secret_problem
from ..schemes.base import SECRET_MIN_BYTES
from ..schemes.standard_keys import (
    SIGNING_PREFIX,
    is_signing_key,
    new_signing_key,
    public_key_of,
)

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
    """ "whsec_…8ILP": the last four characters, enough to tell secrets apart. A signing
    key is told by its public key's instead ("whsk_… of whpk_…RDc="), which are no secret."""
    if is_signing_key(secret):
        try:
            return f"{SIGNING_PREFIX}… of whpk_…{public_key_of(secret)[-4:]}"
        except ValueError:
            return f"{SIGNING_PREFIX}…"
    return f"whsec_…{secret[-4:]}" if len(secret) > 12 else "whsec_…"


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value: a form sent back with an error does not
    echo the secrets typed into it (re-enter them)."""

    def format_value(self, value: Any) -> None:
        return None


class GuardedURLField(forms.URLField):
    """A URL field whose validation DestinationForm.clean_url runs, after the egress
    guard: an internal address in a form the URL validator also refuses (2130706433,
    127.1) is then refused with the guard's rule named, not as "not a URL"."""

    default_validators: list = []


class StoredSecretsForm(forms.ModelForm):
    """A form over a row whose secrets are encrypted at rest (a destination, a source
    record): ``current`` holds its secrets, to keep or remove; when no key set reads
    them, ``unreadable`` says why, none can be kept, and the form saves only with new
    ones, which replace them."""

    keep_secrets = forms.MultipleChoiceField(
        label=_("Current secrets"), required=False, widget=forms.CheckboxSelectMultiple
    )
    new_secrets = forms.CharField(
        label=_("Add secrets"),
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 2, "cols": 60, "autocomplete": "off"}),
    )
    # each form's words for those two fields
    keep_help: Any = ""
    new_help: Any = ""
    # the error when such a row is saved without new secrets (its state interpolated)
    unreadable_message: Any = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, help_text in (("keep_secrets", self.keep_help), ("new_secrets", self.new_help)):
            if name in self.fields:
                self.fields[name].help_text = help_text
        self.unreadable: SecretsUnreadable | None = None
        self.current: list[str] = []
        if self.instance.pk:
            try:
                self.current = list(self.instance.secrets)
            except SecretsUnreadable as exc:
                self.unreadable = exc
        if self.unreadable is not None:
            if "keep_secrets" in self.fields:
                self.fields["keep_secrets"].disabled = True
                self.fields["keep_secrets"].help_text = self.unreadable.state
            if "new_secrets" in self.fields:
                self.fields["new_secrets"].required = True

    def kept_and_added(
        self, cleaned: dict[str, Any], generated: Sequence[str] = ()
    ) -> tuple[list[str], list[str]]:
        """The current secrets ticked to keep, and the new ones (typed, then
        ``generated``) not among them; a row whose secrets cannot be read needs new ones."""
        keep = set(cleaned.get("keep_secrets") or [])
        kept = [s for s in self.current if secret_fingerprint(s) in keep]
        typed = [s for s in cleaned.get("new_secrets") or [] if s not in kept]
        added = typed + list(generated)
        if self.unreadable is not None and not added:
            raise forms.ValidationError(self.unreadable_message % {"state": self.unreadable.state})
        return kept, added


class DestinationForm(StoredSecretsForm):
    """The destination's configuration. Its secrets are write-only: the form lists each
    current one by its last four characters, to keep or to drop, and takes new ones,
    which sign alongside those kept (a rotation). Its URL is checked by the egress guard
    (network/egress.check_url); a name that does not resolve yet is saved with a warning,
    ``url_warning``, which the admin shows."""

    url_warning = ""

    url = GuardedURLField(
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
            "One per line (or comma-separated): an event type (order.paid), or a group "
            "(order.*: every declared type of it but the opt-in ones). None: it is sent nothing."
        ),
    )
    filter = forms.JSONField(
        label=_("Filter"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            'Which of those events it is sent, in JSON: {"data.status": "paid"}, '
            '{"metadata.channel": {"$in": ["web", "app"]}}, {"$or": [...]}. Operators: $eq, '
            "$neq, $in, $nin, $startsWith, $exist. Empty: every one. An event left out is "
            "kept as a message discarded by the filter, with the reason."
        ),
    )
    keep_help = _("Untick a secret to stop signing with it (the end of a rotation).")
    new_help = format_lazy(
        _(
            "One per line: whsec_ followed by the base64 of at least {size} random bytes (a "
            "shared secret, signature v1), or "
            "whsk_ followed by base64 (an Ed25519 signing key, signature v1a). During a "
            "rotation every secret kept or added signs each request. Secrets are never shown "
            "again, not even when the form comes back with an error: type them again then."
        ),
        size=SECRET_MIN_BYTES,
    )
    generate_signing_key = forms.BooleanField(
        label=_("Generate a signing key"),
        required=False,
        help_text=_(
            "Adds a new Ed25519 signing key (whsk_, signature v1a). Its public key is "
            "shown here once saved, for the receiver to verify with; the signing key never is."
        ),
    )

    class Meta:
        model = WebhookDestination
        fields = (
            "name",
            "tenant",
            "url",
            "enabled",
            "event_types",
            "filter",
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
            "tenant": _(
                "Whose it is: your key for the merchant account (a tenant sees its own "
                "destinations and nothing else). Empty for a single shop."
            ),
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

    unreadable_message = _(
        "This destination's %(state)s. Add new secrets (they replace them), or put back "
        "the key they were encrypted with."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "keep_secrets" in self.fields:
            keep_field = cast(forms.MultipleChoiceField, self.fields["keep_secrets"])
            keep_field.choices = [(secret_fingerprint(s), secret_label(s)) for s in self.current]
            self.initial.setdefault("keep_secrets", [secret_fingerprint(s) for s in self.current])
        if "event_types" in self.fields:
            self.initial["event_types"] = "\n".join(self.instance.event_types or [])

    def clean_url(self) -> str:
        url = self.cleaned_data.get("url") or ""
        try:
            self.url_warning = check_url(url)
        except UrlRefused as exc:
            raise forms.ValidationError(str(exc)) from None
        URLValidator()(url)
        return url

    def clean_event_types(self) -> list[str]:
        text = self.cleaned_data.get("event_types") or ""
        found = list(dict.fromkeys(t.strip() for t in re.split(r"[\s,]+", text) if t.strip()))
        problems = subscription_problems(found)
        if problems:
            raise forms.ValidationError(problems)
        return found

    def clean_filter(self) -> Any:
        spec = self.cleaned_data.get("filter")
        if spec in (None, "", {}, []):
            return None
        problem = filter_problem(spec)
        if problem is not None:
            raise forms.ValidationError(problem)
        return spec

    def clean_new_secrets(self) -> list[str]:
        secrets = (self.cleaned_data.get("new_secrets") or "").split()
        for n, secret in enumerate(secrets, 1):
            problem = destination_secret_problem(secret)
            if problem:
                # the message names the line, never the secret
                raise forms.ValidationError(
                    gettext("Line %(line)d %(problem)s.") % {"line": n, "problem": problem}
                )
        return secrets

    def clean(self) -> dict[str, Any]:
        # ModelForm's clean() returns its cleaned_data (the stubs allow an override's None)
        cleaned = cast(dict[str, Any], super().clean())
        generated = [new_signing_key()] if cleaned.get("generate_signing_key") else []
        kept, added = self.kept_and_added(cleaned, generated)
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


EnableForm = note_form(
    "reason",
    label=_("Reason"),
    required=False,
    help_text=_(
        "Optional: why, e.g. the merchant moved its endpoint back. Kept in the "
        "destination's history with your name and the time."
    ),
)
