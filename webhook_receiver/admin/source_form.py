"""The admin's form of a source record: its configuration, and its write-only secrets
named by fingerprint with the last request each verified."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.encryption import SecretsUnreadable, secrets_encrypt
from ..core.fingerprints import secret_fingerprint
from ..presentation.display import duration_text
from ..sources.models import WebhookSource
from ..sources.operations import secrets_problem, slug_problem
from ..sources.records import record_problem
from ..watch.secrets import secrets_last_verified
from .forms import StoredSecretsForm


class SourceForm(StoredSecretsForm):
    """A source record's configuration. Its secrets are write-only: the form lists each
    current one by fingerprint (with the last request it verified), to keep or to remove,
    and takes new ones, which verify beside those kept (a rotation)."""

    keep_help = _(
        "By fingerprint, with the last request each verified. Untick the old one once it "
        "verifies nothing any more (the end of a rotation)."
    )
    new_help = _(
        "One per line, exactly as the sender shows it. Every secret kept or added verifies "
        "requests. Secrets are never shown again, not even when the form comes back with an "
        "error: type them again then."
    )

    class Meta:
        model = WebhookSource
        fields = (
            "slug",
            "scheme",
            "event_key",
            "enabled",
            "tolerance_seconds",
            "max_body_bytes",
            "silence_after_seconds",
            "active_days",
            "active_start",
            "active_end",
            "active_time_zone",
        )
        # a body limit's seven digits do not fit the admin's narrow number box
        widgets = {"max_body_bytes": forms.NumberInput(attrs={"class": "vTextField"})}
        help_texts = {
            "event_key": _(
                "What makes two deliveries one event. GitHub signs the body and not its "
                "delivery id: keyed by the id, a captured body sent again under a new id "
                "would be a new event."
            ),
            "slug": _(
                "The end of the address senders post to: /webhooks/acme/ for acme. A slug of "
                "the settings cannot be used."
            ),
            "enabled": _(
                "Untick to refuse its requests exactly as an unknown slug's (404), each audited."
            ),
            "silence_after_seconds": _(
                "No accepted event for this long opens a silence alert; empty or 0: never."
            ),
            "active_days": _("When silence is unexpected, e.g. mon-fri; empty: every day."),
        }

    unreadable_message = _(
        "This source's %(state)s. Add new secrets (they replace them), or put back the "
        "key they were encrypted with."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        current = self.current
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
        kept, added = self.kept_and_added(cleaned)
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
