from __future__ import annotations

from django.db import models

from . import exceptions


class Result(models.TextChoices):
    """Every answer a delivery, a retry or a replay can end with: the one list of them."""

    # a handler's results, which a receipt stores
    APPLIED = "applied", "Applied"
    STALE = "stale", "Stale (older version, nothing changed)"
    IGNORED = "ignored", "Ignored (no handler for this type)"
    # the key had a receipt already: answered with its stored outcome
    DUPLICATE = "duplicate", "Duplicate"
    # held as a failed event: retried later, or kept for an operator
    DEFERRED = "deferred", "Deferred (will be retried)"
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"
    # a retry or replay: raised again, or found its event missing or locked by another
    FAILED = "failed", "Failed again"
    SKIPPED = "skipped", "Skipped (missing, or being processed)"


# What a receipt can hold, and how a resolved failed event ended.
RECEIPT_RESULTS = (Result.APPLIED, Result.STALE, Result.IGNORED)
RESOLUTIONS = (*RECEIPT_RESULTS, Result.DUPLICATE)


def _choices(members: tuple[Result, ...]) -> list[tuple[str, str]]:
    return [(member.value, member.label) for member in members]


class WebhookReceipt(models.Model):
    """One verified event, claimed once per (source, event_key).

    The row is inserted first, in the same transaction as the event's effect, so it
    exists if and only if that effect committed.
    """

    source = models.CharField(max_length=100)
    event_key = models.CharField(max_length=255)
    event_type = models.CharField(max_length=255, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    signature_timestamp = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=_choices(RECEIPT_RESULTS))
    # the business object the event concerns (an order id for the built-in handlers)
    subject = models.CharField(max_length=255, blank=True)
    # what the first delivery answered; duplicates answer with it
    outcome = models.JSONField(default=dict)
    body = models.BinaryField()
    headers = models.JSONField(default=dict)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            # The claim's ON CONFLICT target (which matches the columns in any order);
            # event_key first, so that the admin's search by event key can use it too.
            models.UniqueConstraint(fields=["event_key", "source"], name="webhook_receipt_key"),
        ]
        # Plain b-tree indexes, declared here rather than with db_index: on PostgreSQL
        # db_index on a text column adds a second (LIKE) index that exact lookups never
        # use, and every index is paid for on each insert of the hot path. The admin's
        # search ORs exact matches on event_key and subject: each needs an index, or
        # PostgreSQL scans the table.
        #
        # (source, received_at): the last accepted event per source (silence, metrics,
        # status) and reconciliation's window, each an index range however quiet the
        # source; received_at alone stays for the admin's unfiltered, newest-first list.
        indexes = [
            models.Index(fields=["received_at"], name="webhook_receipt_received"),
            models.Index(fields=["source", "received_at"], name="webhook_receipt_source_time"),
            models.Index(fields=["subject"], name="webhook_receipt_subject"),
        ]
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.source}:{self.event_key}"


class Verification(models.TextChoices):
    """How a request fared before its event was looked at: verified, or the code of the
    rejection (each code is defined once, on its exception class)."""

    VERIFIED = "verified", "Verified"
    UNKNOWN_SOURCE = exceptions.UnknownSource.code, "Unknown source"
    PAYLOAD_TOO_LARGE = exceptions.PayloadTooLarge.code, "Payload too large"
    MISSING_HEADERS = exceptions.MissingSignatureHeaders.code, "Missing signature headers"
    MALFORMED_HEADERS = exceptions.MalformedSignatureHeaders.code, "Malformed signature headers"
    INVALID_SIGNATURE = exceptions.InvalidSignature.code, "Invalid signature"
    TIMESTAMP_OUT_OF_TOLERANCE = (
        exceptions.TimestampOutOfTolerance.code,
        "Timestamp out of tolerance",
    )


class RequestAudit(models.Model):
    """One row per request to the endpoint, accepted or not.

    Holds the body's SHA-256, never the body: rejected bodies are untrusted, and an
    accepted body lives on its receipt.
    """

    source = models.CharField(max_length=100)
    message_id = models.CharField(max_length=255, blank=True)
    event_key = models.CharField(max_length=255, blank=True)
    signature_timestamp = models.DateTimeField(null=True, blank=True)
    verification = models.CharField(max_length=32, choices=Verification.choices)
    # the answer: a Result after verification, else the rejection's code (Verification),
    # or the error's class name for a 503
    result = models.CharField(max_length=40, blank=True)
    response_status = models.PositiveSmallIntegerField()
    body_sha256 = models.CharField(max_length=64, blank=True)
    body_size = models.PositiveIntegerField(null=True, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    received_at = models.DateTimeField()

    class Meta:
        # received_at: retention and the admin's ordering; event_key: the admin's search
        # (every request writes a row here, so nothing more is indexed)
        indexes = [
            models.Index(fields=["received_at"], name="webhook_audit_received"),
            models.Index(fields=["event_key"], name="webhook_audit_event_key"),
        ]
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.source} {self.response_status} {self.verification}"


class RejectionTally(models.Model):
    """Refused requests per (minute, source, reason), every one of them counted.

    The first ``REJECTED_AUDIT_PER_MINUTE`` of each have a ``RequestAudit`` record of
    their own; the rest (``unrecorded``) are counted here only, so that a flood of bad
    requests writes a row a minute per source and reason rather than one per request.
    Refused requests in a minute = their audit records + ``unrecorded``, exactly.
    """

    # the start of the minute (UTC) the requests arrived in
    minute = models.DateTimeField()
    # a configured source's slug, or "" for every slug that is not configured: any URL
    # under the endpoint makes one, and they must not make a row each
    source = models.CharField(max_length=100, blank=True)
    # the rejection's code (a Verification other than verified)
    reason = models.CharField(max_length=32, choices=Verification.choices)
    requests = models.PositiveIntegerField()
    unrecorded = models.PositiveIntegerField()

    class Meta:
        constraints = [
            # the upsert's ON CONFLICT target; minute first, so that it is also the index
            # of retention's and the overview's time ranges (nothing else is indexed)
            models.UniqueConstraint(
                fields=["minute", "source", "reason"], name="webhook_tally_minute_key"
            ),
        ]
        ordering = ["-minute"]

    def __str__(self) -> str:
        return f"{self.source or '(not configured)'} {self.reason} {self.minute:%Y-%m-%d %H:%M}"


class FailureStatus(models.TextChoices):
    RETRYING = "retrying", "Retrying"
    DEAD = "dead", "Dead"
    RESOLVED = "resolved", "Resolved"
    DISCARDED = "discarded", "Discarded"


class FailedEvent(models.Model):
    """A verified event whose processing failed: everything needed to apply it later.

    Written in its own transaction after the failed claim rolled back. The retry
    schedule lives here (``next_attempt_at``); retries and replays run the stored,
    already verified bytes under the original event key.
    """

    source = models.CharField(max_length=100)
    event_key = models.CharField(max_length=255)
    event_type = models.CharField(max_length=255, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    signature_timestamp = models.DateTimeField(null=True, blank=True)
    body = models.BinaryField()
    headers = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=FailureStatus.choices)
    attempts = models.PositiveIntegerField(default=0)
    # one entry per failed attempt: at, attempt, trigger, kind, exception, message, traceback
    errors = models.JSONField(default=list)
    last_error_class = models.CharField(max_length=255, blank=True)
    last_error_message = models.TextField(blank=True)
    first_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # how it ended, once resolved
    resolution = models.CharField(max_length=16, blank=True, choices=_choices(RESOLUTIONS))
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_replayed_by = models.CharField(max_length=150, blank=True)
    last_replayed_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.CharField(max_length=150, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    discard_reason = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # event_key first: the admin's search by event key uses it too
            models.UniqueConstraint(fields=["event_key", "source"], name="webhook_failed_key"),
        ]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="webhook_failed_due"),
            models.Index(fields=["status", "updated_at"], name="webhook_failed_updated"),
            # counts per source and status, and the oldest retry per source (metrics)
            models.Index(
                fields=["source", "status", "next_attempt_at"], name="webhook_failed_source"
            ),
            # the last verified event a source sent that was captured (silence)
            models.Index(fields=["source", "first_attempt_at"], name="webhook_failed_first"),
        ]
        ordering = ["-last_attempt_at"]
        permissions = [
            ("replay_failedevent", "Can replay failed events"),
            ("discard_failedevent", "Can discard failed events"),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.event_key} ({self.status})"


# --- reconciliation: the sender's record of truth against ours --------------------------


class RunOutcome(models.TextChoices):
    RUNNING = "running", "Running"
    OK = "ok", "OK (consistent)"
    NEEDS_REPAIR = "needs_repair", "Needs repair"
    FAILED = "failed", "Failed (the run itself)"


class ReconciliationRun(models.Model):
    """One comparison of a source's sender records with ours, over a closed window.

    It changes no business state: what it finds becomes RepairItems for a person.
    """

    source = models.CharField(max_length=100)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=RunOutcome.choices)
    sender_records = models.PositiveIntegerField(default=0)
    # open items found by this run, per kind (missing, failed, unexpected, state_mismatch)
    counts = models.JSONField(default=dict)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            # one run per source at a time, enforced by the database: a second start
            # fails to insert (a run abandoned by a killed worker is closed on the next
            # start, once it is older than RECONCILE_RUN_TIMEOUT_SECONDS)
            models.UniqueConstraint(
                fields=["source"],
                condition=models.Q(outcome="running"),
                name="webhook_reconcile_one_running",
            ),
        ]
        indexes = [
            models.Index(fields=["started_at"], name="webhook_reconcile_started"),
            # a source's last run (the overview, webhook_status)
            models.Index(fields=["source", "started_at"], name="webhook_reconcile_source"),
        ]
        ordering = ["-started_at"]

    def __str__(self) -> str:
        window = f"{self.window_start:%Y-%m-%d %H:%M}–{self.window_end:%H:%M}"
        return f"{self.source} {window} {self.outcome}"


class RepairKind(models.TextChoices):
    MISSING = "missing", "Missing (sent, never accepted)"
    FAILED = "failed", "Failed (held as a failed event)"
    UNEXPECTED = "unexpected", "Unexpected (applied, not listed by the sender)"
    STATE_MISMATCH = "state_mismatch", "State mismatch"


class RepairStatus(models.TextChoices):
    OPEN = "open", "Open"
    RESOLVED = "resolved", "Resolved"


class RepairItem(models.Model):
    """A difference a reconciliation run found, for a person to repair or resolve.

    One open item per (source, kind, key): later runs update it, and one that finds the
    difference gone resolves it ("resolved: now consistent").
    """

    source = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=RepairKind.choices)
    # the event key; for a state mismatch, "order:<order id>"
    event_key = models.CharField(max_length=255)
    order_id = models.CharField(max_length=100, blank=True)
    event_type = models.CharField(max_length=255, blank=True)
    # when it happened: the sender's creation time (for an unexpected event, our receipt
    # time); a later run over a window holding this time resolves the item if it is gone
    occurred_at = models.DateTimeField()
    sender_says = models.JSONField(default=dict)
    we_hold = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=RepairStatus.choices)
    first_run = models.ForeignKey(ReconciliationRun, on_delete=models.PROTECT, related_name="+")
    last_run = models.ForeignKey(ReconciliationRun, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    resolved_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_note = models.TextField(blank=True)
    # every repair action taken on it: at, by, action, note, result, detail
    history = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["event_key", "source", "kind"],
                condition=models.Q(status="open"),
                name="webhook_repair_one_open",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "source"], name="webhook_repair_status"),
            models.Index(fields=["order_id"], name="webhook_repair_order"),
        ]
        ordering = ["-updated_at"]
        permissions = [
            ("replay_repairitem", "Can replay a failed event from a repair item"),
            ("apply_repairitem", "Can fetch and apply a missing event from a repair item"),
            ("redeliver_repairitem", "Can ask the sender to redeliver a repair item's event"),
            ("resolve_repairitem", "Can resolve repair items"),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.kind} {self.event_key} ({self.status})"


# --- watching: silence, heartbeats, the overview -----------------------------------------


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

    def __str__(self) -> str:
        return f"{self.name} at {self.seen_at:%Y-%m-%d %H:%M:%S}"


class SourceOverview(WebhookReceipt):
    """No table of its own: the admin's overview page (one row per source) hangs here,
    so that it is listed on the admin index and guarded by its own view permission."""

    class Meta:
        proxy = True
        verbose_name = "overview"
        verbose_name_plural = "overview"


# --- sending: the outbox (its models live in outbox/models.py; importing them here
# is what registers them with this app) -------------------------------------------------

from .outbox.models import (  # noqa: E402, F401
    DeliveryAttempt,
    MessageStatus,
    OutboxMessage,
    WebhookDestination,
)
