"""What watching keeps: silence alerts, heartbeats, and the proxy the overview page hangs
on.

Imported by ``webhook_receiver.models``, so that Django finds them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..inbound.models import WebhookReceipt


class SilenceAlert(models.Model):
    """A source that has accepted no event for longer than its SILENCE_AFTER_SECONDS.

    One per incident: the database allows one unresolved alert per source, so checks on
    several workers at once cannot open two. Resolved when accepted traffic returns.
    """

    source = models.CharField(max_length=100)
    opened_at = models.DateTimeField()
    # the last accepted event before the silence (None: this source never had one)
    last_accepted_at = models.DateTimeField(null=True, blank=True)
    silence_after_seconds = models.PositiveIntegerField()
    # requests refused in the silent window, per rejection code: a silence made of
    # refusals (a rotated secret, a wrong URL) says so
    rejected_counts = models.JSONField(default=dict)
    rejected_total = models.PositiveIntegerField(default=0)
    last_checked_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    # the newest accepted event the resolving check found
    resolved_by_event_at = models.DateTimeField(null=True, blank=True)
    opened_notice_sent_at = models.DateTimeField(null=True, blank=True)
    recovery_notice_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("silence alert")
        verbose_name_plural = _("silence alerts")
        constraints = [
            models.UniqueConstraint(
                fields=["source"],
                condition=models.Q(resolved_at__isnull=True),
                name="webhook_silence_one_open",
            ),
        ]
        indexes = [models.Index(fields=["opened_at"], name="webhook_silence_opened")]
        ordering = ["-opened_at"]

    def __str__(self) -> str:
        state = "resolved" if self.resolved_at else "open"
        since = self.last_accepted_at
        since_text = f"{since:%Y-%m-%d %H:%M} UTC" if since else "its first request"
        return f"{self.source} silent since {since_text} ({state})"


class Heartbeat(models.Model):
    """The last time a periodic process was seen: beat writes "beat" every minute, and
    /health/ fails once it is older than HEARTBEAT_MAX_AGE_SECONDS."""

    name = models.CharField(max_length=100, primary_key=True)
    seen_at = models.DateTimeField()

    class Meta:
        verbose_name = _("heartbeat")
        verbose_name_plural = _("heartbeats")

    def __str__(self) -> str:
        return f"{self.name} at {self.seen_at:%Y-%m-%d %H:%M:%S}"


class SourceOverview(WebhookReceipt):
    """No table of its own: the admin's overview page (one row per source) hangs here,
    so that it is listed on the admin index and guarded by its own view permission."""

    class Meta:
        proxy = True
        verbose_name = _("overview")
        verbose_name_plural = _("overview")
