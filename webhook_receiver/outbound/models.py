"""The outbox's tables: destinations, messages, and one row per delivery attempt.

Imported by ``webhook_receiver.models`` so that Django finds them; they belong to the
``webhook_receiver`` app.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.encryption import EncryptedSecretsField
from .catalog import subscribed


class WebhookDestination(models.Model):
    """An endpoint that receives this project's own webhooks, signed the Standard
    Webhooks way, under its own limits and retry policy."""

    name = models.SlugField(max_length=100, unique=True)
    # whose it is: the host's key for a merchant account (tenancy.py); empty for a
    # single-shop host
    tenant = models.CharField(max_length=100, blank=True, default="", db_default="", db_index=True)
    url = models.URLField(max_length=2000)
    # its owner's words for it (the portal shows it beside the name)
    description = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Standard Webhooks secrets ("whsec_" + base64, signature v1) and Ed25519 signing keys
    # ("whsk_" + base64, signature v1a); during a rotation every one of them signs (the
    # header carries one signature per secret).
    # Stored encrypted (encryption.py): the column holds Fernet tokens, never a secret.
    secrets = EncryptedSecretsField(default=list)
    # a rotation's outgoing secrets (signing_secrets.secret_rotate): they sign beside
    # `secrets` until `retiring_until`, then no longer (signing_with)
    retiring_secrets = EncryptedSecretsField(default=list, blank=True)
    retiring_until = models.DateTimeField(null=True, blank=True)
    # what it is sent: event types by name, and group.* patterns (catalog.subscribed);
    # empty: nothing
    event_types = models.JSONField(default=list, blank=True)
    # which of those events it is sent (filters.py): JSON conditions on the event's type,
    # data and metadata; null: every one
    filter = models.JSONField(null=True, blank=True)
    # token bucket: rate_count starts per rate_seconds, refilled continuously, holding at
    # most `burst` tokens: in any span of T seconds, at most rate * T + burst starts
    rate_count = models.PositiveIntegerField(default=10)
    rate_seconds = models.FloatField(default=1.0)
    burst = models.PositiveIntegerField(default=10)
    # semaphore: requests in flight at once, across every worker
    max_in_flight = models.PositiveIntegerField(default=4)
    timeout_seconds = models.FloatField(default=10.0)
    # retry policy: attempts in all, and full-jitter backoff between base and cap
    max_attempts = models.PositiveIntegerField(default=12)
    backoff_base_seconds = models.FloatField(default=2.0)
    backoff_cap_seconds = models.FloatField(default=3600.0)
    # longest Retry-After honoured; a longer one is cut to this
    retry_after_cap_seconds = models.FloatField(default=300.0)
    # circuit breaker: this many consecutive failures pause the destination for the
    # cool-down, then one probe decides
    breaker_threshold = models.PositiveIntegerField(default=10)
    breaker_cooldown_seconds = models.FloatField(default=60.0)
    enabled = models.BooleanField(default=True)
    # how long the receiving end remembers a key: a delivered message is kept at least
    # this long, so that whatever is sent again within it carries its original key
    replay_horizon_days = models.PositiveIntegerField(default=30)

    # limiter and breaker state, written under this row's lock
    tokens = models.FloatField(default=0.0)
    tokens_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    paused_until = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    # the last round of answers the relay could not record, and why: the overview names
    # that cause while it is newer than the last answer recorded
    record_error = models.TextField(blank=True)
    record_failed_at = models.DateTimeField(null=True, blank=True)
    # retirement (retirement.py): why and when the relay disabled it (an answer of 410
    # Gone, or no success for DISABLE_AFTER_FAILING_DAYS), empty once enabled again; and
    # since when its answers have failed without a success, and when that was warned of
    disabled_reason = models.TextField(blank=True, default="", db_default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)
    failing_warned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("webhook destination")
        verbose_name_plural = _("webhook destinations")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def disabled_by_relay(self) -> bool:
        """Disabled by the relay itself (410 Gone, or failing too long), not an operator."""
        return not self.enabled and bool(self.disabled_reason)

    def signing_with(self, timestamp: float) -> list[str]:
        """The secrets that sign a request made at ``timestamp`` (Unix seconds): its own,
        and a rotation's outgoing ones until their overlap ends."""
        retiring = self.retiring_secrets or []
        if retiring and self.retiring_until and timestamp < self.retiring_until.timestamp():
            return [*self.secrets, *retiring]
        return list(self.secrets)

    def subscribes_to(self, event_type: str) -> bool:
        return self.enabled and subscribed(self.event_types or [], event_type)


# the destinations whose messages the relay claims and admission fans out to: a disabled
# one (by an operator, or retired by the relay) holds its messages pending
ADMITTING = models.Q(enabled=True)


class MessageStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    SENDING = "sending", _("Sending (claimed by a relay)")
    DELIVERED = "delivered", _("Delivered")
    FAILED = "failed", _("Failed (terminal: for an operator)")
    DISCARDED = "discarded", _("Discarded")


class OutboxMessage(models.Model):
    """One logical delivery to one destination, created in the transaction whose effect
    it reports: it exists if and only if that transaction committed. Its key never
    changes, whatever the attempt."""

    # no index of its own: the indexes below all start with it
    destination = models.ForeignKey(WebhookDestination, on_delete=models.PROTECT, db_index=False)
    key = models.CharField(max_length=255)
    event_type = models.CharField(max_length=255)
    payload = models.JSONField()
    # a small JSON object about how the payload was made (a prompt's version, a model's
    # token usage), kept beside the message and never sent: outside its identity, so a
    # second admission of the key with other metadata is a duplicate that changes nothing
    metadata = models.JSONField(default=dict, blank=True)
    # messages sharing one, to one destination, are delivered one after another
    ordering_key = models.CharField(max_length=255, blank=True)
    status = models.CharField(max_length=16, choices=MessageStatus.choices)
    # every HTTP attempt; `failures` counts those that spend the retry budget (a 429 or
    # 503 with Retry-After is the destination pacing us, not failing)
    attempts = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    # when it may be claimed; a deferral moves this, never the message's place
    next_attempt_at = models.DateTimeField()
    # a claimed message's lease: a worker that dies holds it until then
    lease_until = models.DateTimeField(null=True, blank=True)
    # the inbound event whose handler enqueued it, for the trace page
    origin_source = models.CharField(max_length=100, blank=True)
    origin_event_key = models.CharField(max_length=255, blank=True)
    # with OpenTelemetry, the W3C traceparent of the span that admitted it: its
    # deliveries continue that trace (core/tracing.py); "" without one
    traceparent = models.CharField(max_length=128, blank=True, default="", db_default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    discarded_by = models.CharField(max_length=150, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    discard_reason = models.TextField(blank=True)
    # the recovery job that last sent it again (or wrote it: a missing one), if any
    recovery = models.ForeignKey(
        "RecoveryJob", null=True, blank=True, on_delete=models.SET_NULL, db_index=False,
        related_name="messages",
    )  # fmt: skip

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        constraints = [
            # the durable identity: one message per logical key and destination, forever
            models.UniqueConstraint(fields=["destination", "key"], name="webhook_outbox_key"),
        ]
        indexes = [
            # the relay's claim (pending, sending) and the metrics' backlog (with the
            # terminal ones): a destination's open messages in admission order, however
            # long its delivered history
            models.Index(
                fields=["destination", "id"],
                condition=models.Q(status__in=["pending", "sending", "failed"]),
                name="webhook_outbox_open",
            ),
            # the admin's lists and counts by destination and status
            models.Index(fields=["destination", "status", "id"], name="webhook_outbox_claim"),
            # strict order within an ordering key: is an older one still open?
            models.Index(
                fields=["destination", "ordering_key", "id"], name="webhook_outbox_ordering"
            ),
            # the same question over open messages only, for the status's readings
            # (selectors.destinations_with_health): a probe per due message that never
            # walks an order's delivered history, and a plan cheap enough that
            # PostgreSQL does not compile it (JIT: 50 ms of 95 on a million messages)
            models.Index(
                fields=["destination", "ordering_key", "id"],
                condition=models.Q(status__in=["pending", "sending", "failed"])
                & ~models.Q(ordering_key=""),
                name="webhook_outbox_open_ordering",
            ),
            # the sweep: which destinations have something due
            models.Index(fields=["status", "next_attempt_at"], name="webhook_outbox_due"),
            # is an older message of the key failed, waiting for an operator (the status's
            # held-back count)? Failed messages alone: whatever plan the statistics give
            # the probe, it reads no pending or sending message
            models.Index(
                fields=["destination", "ordering_key", "id"],
                condition=models.Q(status="failed") & ~models.Q(ordering_key=""),
                name="webhook_outbox_failed_ordering",
            ),
            # a destination's requests in flight (the relay's claim, its poll, the status):
            # its messages sending, by when their leases end
            models.Index(
                fields=["destination", "lease_until"],
                condition=models.Q(status="sending"),
                name="webhook_outbox_in_flight",
            ),
            models.Index(fields=["origin_event_key"], name="webhook_outbox_origin"),
        ]
        ordering = ["-id"]
        permissions = [
            ("retry_outboxmessage", "Can retry outbox messages now"),
            ("discard_outboxmessage", "Can discard outbox messages"),
        ]

    def __str__(self) -> str:
        return f"{self.destination_id}:{self.key} ({self.status})"


class DeliveryAttempt(models.Model):
    """One HTTP attempt of a message: what was answered, how long it took, and when the
    message may be tried again."""

    message = models.ForeignKey(OutboxMessage, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("delivery attempt")
        verbose_name_plural = _("delivery attempts")
        ordering = ["message", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.message_id}: {self.status_code or self.error}"


class RecoveryKind(models.TextChoices):
    RECOVER = "recover", _("Recover failed messages")
    MISSING = "missing", _("Replay missing messages")
    REPLAY = "replay", _("Replay delivered messages")


class RecoveryState(models.TextChoices):
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    CANCELLED = "cancelled", _("Cancelled")


class RecoveryJob(models.Model):
    """One recovery of a destination's messages (recovery.py): what was asked, by whom,
    how many its plan counted, and how far its run has gone. Its run releases messages
    in id order, past ``last_id`` and up to ``max_id`` (the plan's bound), at ``rate``
    a second at most; the relay sends them."""

    destination = models.ForeignKey(
        WebhookDestination, on_delete=models.PROTECT, related_name="recovery_jobs"
    )
    kind = models.CharField(max_length=16, choices=RecoveryKind.choices)
    # what was asked: admitted in [since, until); event types and group.* patterns
    # (empty: every type); answer classes ("2xx" … "5xx", "none"; empty: any); a prefix
    since = models.DateTimeField()
    until = models.DateTimeField(null=True, blank=True)
    event_types = models.JSONField(default=list, blank=True)
    answer_classes = models.JSONField(default=list, blank=True)
    ordering_key_prefix = models.CharField(max_length=255, blank=True)
    # the event types the plan found matching (the subscription's, for a missing one):
    # the run selects these, so that it sends what the plan counted; null: every type
    matched_types = models.JSONField(null=True, blank=True)
    rate = models.FloatField()
    state = models.CharField(max_length=16, choices=RecoveryState.choices)
    planned = models.PositiveIntegerField(default=0)
    released = models.PositiveIntegerField(default=0)
    max_id = models.BigIntegerField(default=0)
    last_id = models.BigIntegerField(default=0)
    # the pace: releases it may make now, when it last looked, and how many of the
    # destination's other messages then waited to be sent
    credit = models.FloatField(default=0.0)
    stepped_at = models.DateTimeField(null=True, blank=True)
    live_waiting = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name = _("recovery job")
        verbose_name_plural = _("recovery jobs")
        ordering = ["-id"]
        constraints = [
            # one running job a destination: two would send the same messages twice
            models.UniqueConstraint(
                fields=["destination"],
                condition=models.Q(state="running"),
                name="webhook_recovery_one_running",
            ),
        ]
        permissions = [("cancel_recoveryjob", "Can cancel recovery jobs")]

    def __str__(self) -> str:
        return f"recovery #{self.pk} of {self.destination_id} ({self.kind}, {self.state})"
