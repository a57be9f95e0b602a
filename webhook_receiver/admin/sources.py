"""Sources kept as records: listed, added, changed, rotated, disabled here (or with
``manage.py webhook_source``). A change is live in every process within
SOURCE_RECORDS_TTL_SECONDS, without a restart. Their secrets are never shown: the list
counts them, the form (admin/forms.py) names each by fingerprint with the last request it
verified, to keep or to remove, and takes new ones.

The settings' sources are not records: a slug they define cannot be added here, and a
record that an edit of the settings shadowed is marked, never used (check W005).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..conf import app_settings
from ..core.encryption import secrets_unreadable, with_stored_secrets
from ..sources.lookup import records
from ..sources.models import WebhookSource
from ..sources.operations import secret_count, secrets_weak
from .source_form import SourceForm


@admin.register(WebhookSource)
class WebhookSourceAdmin(admin.ModelAdmin):
    form = SourceForm
    list_display = ("slug", "scheme", "enabled", "state", "secret_count", "updated_at")
    list_filter = ("enabled", "scheme")
    search_fields = ("slug",)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple]:
        secrets = ("keep_secrets", "new_secrets") if obj is not None else ("new_secrets",)
        ttl = app_settings().source_records_ttl
        live = gettext(
            "A change here is live in every process within %(ttl)g seconds "
            "(SOURCE_RECORDS_TTL_SECONDS), without a restart."
        ) % {"ttl": ttl}
        return [
            (
                _("Source"),
                {"fields": ("slug", "scheme", "event_key", "enabled"), "description": live},
            ),
            (_("Secrets"), {"fields": secrets}),
            (_("Limits"), {"fields": ("tolerance_seconds", "max_body_bytes")}),
            (
                _("Silence"),
                {
                    "fields": (
                        "silence_after_seconds",
                        "active_days",
                        ("active_start", "active_end"),
                        "active_time_zone",
                    )
                },
            ),
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookSource]:
        # the secrets as stored: a row no key decrypts is shown as such, not a 500
        return with_stored_secrets(super().get_queryset(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # the slug is its senders' URL and its records' name: a new slug is a new source
        return ("slug",) if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Any, form: forms.Form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        records.clear()  # this process at once; the others within the TTL
        weak = secrets_weak(obj.scheme, obj.secrets)
        if weak:  # a typed GitHub secret: kept, the sender has it
            self.message_user(request, f"Source {obj.slug}: {weak}.", messages.WARNING)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        records.clear()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookSource]) -> None:
        super().delete_queryset(request, queryset)
        records.clear()

    @admin.display(description=_("state"))
    def state(self, obj: WebhookSource) -> str:
        if obj.slug in app_settings().sources:
            return gettext("not used: the settings define this slug (W005)")
        if not obj.enabled:
            return gettext("disabled: answered 404")
        unreadable = secrets_unreadable(obj)
        if unreadable is not None:
            return gettext("%(state)s: answered 503") % {"state": unreadable.state}
        return gettext("receiving")

    @admin.display(description=_("secrets"))
    def secret_count(self, obj: WebhookSource) -> str:
        count = secret_count(obj)
        return ngettext("%d secret", "%d secrets", count) % count
