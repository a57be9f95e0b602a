"""The receive side's tables: receipts (the claim), the audit trail with its tallies of
refused requests, and failed events (retries, dead letters, replay).

Imported by ``webhook_receiver.models``, so that Django finds them; they belong to the
``webhook_receiver`` app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.utils.translation import gettext_lazy as _

from .. import exceptions

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


class Result(models.TextChoices):
    """Every answer a delivery, a retry or a replay can end with: the one list of them."""

    # a handler's results, which a receipt stores
    APPLIED = "applied", _("Applied")
    STALE = "stale", _("Stale (older version, nothing changed)")
    IGNORED = "ignored", _("Ignored (no handler for this type)")
    # the key had a receipt already: answered with its stored outcome
    DUPLICATE = "duplicate", _("Duplicate")
    # held as a failed event: retried later, or kept for an operator
    DEFERRED = "deferred", _("Deferred (will be retried)")
    DEAD_LETTERED = "dead_lettered", _("Dead-lettered")
    # a retry or replay: raised again, or found its event missing or locked by another
    FAILED = "failed", _("Failed again")
    SKIPPED = "skipped", _("Skipped (missing, or being processed)")


# What a receipt can hold, and how a resolved failed event ended.
RECEIPT_RESULTS = (Result.APPLIED, Result.STALE, Result.IGNORED)
RESOLUTIONS = (*RECEIPT_RESULTS, Result.DUPLICATE)


def _choices(members: tuple[Result, ...]) -> list[tuple[str, StrOrPromise]]:
    return [(member.value, member.label) for member in members]


class StoredEvent(models.Model):
    """A verified event as the app keeps it: where it came from, its key, and the bytes
    and headers as received (signatures redacted), which retries and replays run again."""

    source = models.CharField(max_length=100)
    event_key = models.CharField(max_length=255)
    event_type = models.CharField(max_length=255, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    signature_timestamp = models.DateTimeField(null=True, blank=True)
    body = models.BinaryField()
    headers = models.JSONField(default=dict)

    class Meta:
        abstract = True


class WebhookReceipt(StoredEvent):
    """One verified event, claimed once per (source, event_key).

    The row is inserted first, in the same transaction as the event's effect, so it
    exists if and only if that effect committed.
    """

    status = models.CharField(max_length=16, choices=_choices(RECEIPT_RESULTS))
    # the business object the event concerns (an order id for the built-in handlers)
    subject = models.CharField(max_length=255, blank=True)
    # what the first delivery answered; duplicates answer with it
    outcome = models.JSONField(default=dict)
    received_at = models.DateTimeField()

    class Meta:
        verbose_name = _("webhook receipt")
        verbose_name_plural = _("webhook receipts")
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

    VERIFIED = "verified", _("Verified")
    UNKNOWN_SOURCE = exceptions.UnknownSource.code, _("Unknown source")
    PAYLOAD_TOO_LARGE = exceptions.PayloadTooLarge.code, _("Payload too large")
    MISSING_HEADERS = exceptions.MissingSignatureHeaders.code, _("Missing signature headers")
    MALFORMED_HEADERS = exceptions.MalformedSignatureHeaders.code, _("Malformed signature headers")
    INVALID_SIGNATURE = exceptions.InvalidSignature.code, _("Invalid signature")
    TIMESTAMP_OUT_OF_TOLERANCE = (
        exceptions.TimestampOutOfTolerance.code,
        _("Timestamp out of tolerance"),
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
    # which of its source's secrets verified it, by fingerprint (core/fingerprints.py),
    # never by value: a rotation's progress; null when refused, or the scheme did not say.
    # Nullable so that adding it rewrites no row of a large table.
    secret_fingerprint = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001

    class Meta:
        verbose_name = _("request audit")
        verbose_name_plural = _("request audits")
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
        verbose_name = _("rejection tally")
        verbose_name_plural = _("rejection tallies")
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
    RETRYING = "retrying", _("Retrying")
    DEAD = "dead", _("Dead")
    RESOLVED = "resolved", _("Resolved")
    DISCARDED = "discarded", _("Discarded")


class FailedEvent(StoredEvent):
    """A verified event whose processing failed: everything needed to apply it later.

    Written in its own transaction after the failed claim rolled back. The retry
    schedule lives here (``next_attempt_at``); retries and replays run the stored,
    already verified bytes under the original event key.
    """

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
        verbose_name = _("failed event")
        verbose_name_plural = _("failed events")
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
