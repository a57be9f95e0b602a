"""Reconciliation's tables: each run against a sender's record of truth, and the repair
items it found for a person.

Imported by ``webhook_receiver.models``, so that Django finds them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunOutcome(models.TextChoices):
    RUNNING = "running", _("Running")
    OK = "ok", _("OK (consistent)")
    NEEDS_REPAIR = "needs_repair", _("Needs repair")
    FAILED = "failed", _("Failed (the run itself)")


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
        verbose_name = _("reconciliation run")
        verbose_name_plural = _("reconciliation runs")
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
    MISSING = "missing", _("Missing (sent, never accepted)")
    FAILED = "failed", _("Failed (held as a failed event)")
    UNEXPECTED = "unexpected", _("Unexpected (applied, not listed by the sender)")
    STATE_MISMATCH = "state_mismatch", _("State mismatch")


class RepairStatus(models.TextChoices):
    OPEN = "open", _("Open")
    RESOLVED = "resolved", _("Resolved")


class RepairItem(models.Model):
    """A difference a reconciliation run found, for a person to repair or resolve.

    One open item per (source, kind, key): later runs update it, and one that finds the
    difference gone resolves it ("resolved: now consistent").
    """

    source = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=RepairKind.choices)
    # the event key; for a state mismatch, "state:<subject>"
    event_key = models.CharField(max_length=255)
    # the business object it concerns (an order id): as a receipt's subject, or the one
    # the host's StateComparison named
    subject = models.CharField(max_length=255, blank=True)
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
        verbose_name = _("repair item")
        verbose_name_plural = _("repair items")
        constraints = [
            models.UniqueConstraint(
                fields=["event_key", "source", "kind"],
                condition=models.Q(status="open"),
                name="webhook_repair_one_open",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "source"], name="webhook_repair_status"),
            models.Index(fields=["subject"], name="webhook_repair_subject"),
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
