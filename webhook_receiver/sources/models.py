"""The table of sources kept as records.

Imported by ``webhook_receiver.models``, so that Django finds it; it belongs to the
``webhook_receiver`` app.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..conf.keys import key_default
from ..conf.sources import ActiveHours, SourceConfig
from ..core.encryption import EncryptedSecretsField

# the built-in schemes by the name a person knows them by; a test holds these to SCHEMES
SCHEME_CHOICES = [
    ("standard", _("Standard Webhooks")),
    ("stripe", _("Stripe")),
    ("github", _("GitHub")),
]


# How a record's events are keyed (its EVENT_KEY), by name: a record never names code.
# "": the scheme's own choice (GitHub: the signed body; the others: their signed id)
EVENT_KEY_CHOICES = [
    ("", _("the scheme's choice (GitHub: the signed body; others: the delivery id)")),
    ("delivery_id", _("the delivery id the sender sends")),
    ("signed_body", _("the signed body's SHA-256 (GitHub: a body sent again is a duplicate)")),
]


class WebhookSource(models.Model):
    """A source that senders post to at ``/webhooks/<slug>/``, configured here rather than
    in ``WEBHOOK_RECEIVER["SOURCES"]``. A slug the settings define is theirs: a record of
    the same slug is never used (system check W005)."""

    slug = models.SlugField(max_length=100, unique=True)
    # built-in schemes only: a record never names code to import
    scheme = models.CharField(
        max_length=32, choices=SCHEME_CHOICES, default=key_default(SourceConfig, "scheme")
    )
    # every one of them verifies (a rotation keeps the old beside the new). Stored
    # encrypted (core/encryption.py): the column holds Fernet tokens, never a secret.
    secrets = EncryptedSecretsField(default=list)
    # GitHub signs the body, not its X-GitHub-Delivery id: keyed by that id, a captured
    # body sent again under a new id is a new event; keyed by the body, a duplicate
    event_key = models.CharField(max_length=32, blank=True, default="", choices=EVENT_KEY_CHOICES)
    # the settings' defaults (conf/sources.py), which a record shares
    tolerance_seconds = models.PositiveIntegerField(
        default=key_default(SourceConfig, "tolerance_seconds")
    )
    max_body_bytes = models.PositiveIntegerField(
        default=key_default(SourceConfig, "max_body_bytes")
    )
    # no accepted event for this long opens a silence alert; empty or 0: never
    silence_after_seconds = models.PositiveIntegerField(
        null=True, blank=True, default=key_default(SourceConfig, "silence_after")
    )
    # when silence is unexpected (ACTIVE_HOURS of the settings): days like "mon-fri",
    # a daily span, its time zone; no days and no span: always
    active_days = models.CharField(max_length=64, blank=True)
    active_start = models.TimeField(null=True, blank=True)
    active_end = models.TimeField(null=True, blank=True)
    active_time_zone = models.CharField(
        max_length=64, blank=True, default=key_default(ActiveHours, "tz")
    )
    # disabled: answered exactly as an unknown slug is (404), each request audited
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("webhook source")
        verbose_name_plural = _("webhook sources")
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug
