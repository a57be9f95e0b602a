"""Reconciliation runs and repair items: what the comparison with senders found.

Read-only for now: the repair actions (replay, fetch and apply, request redelivery,
resolve with a note) come with their permissions in a later release; until then an
item is repaired through the failed events' admin or replay_dead_letters, and closes
itself when a later run finds it consistent.
"""

from __future__ import annotations

import json

from django.contrib import admin

from ..models import ReconciliationRun, RepairItem, RunOutcome
from .base import ReadOnlyAdmin, _pre


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(ReadOnlyAdmin):
    list_display = (
        "started_at",
        "source",
        "outcome",
        "found",
        "sender_records",
        "window_start",
        "window_end",
        "finished_at",
    )
    list_filter = ("source", "outcome", ("started_at", admin.DateFieldListFilter))
    date_hierarchy = "started_at"

    @admin.display(description="found")
    def found(self, obj: ReconciliationRun) -> str:
        """What an operator looks for first: why it failed, or what it found."""
        if obj.outcome == RunOutcome.FAILED:
            return obj.error[:120]
        found = ", ".join(f"{n} {kind}" for kind, n in sorted(obj.counts.items()) if n)
        return found or "nothing"


@admin.register(RepairItem)
class RepairItemAdmin(ReadOnlyAdmin):
    list_display = (
        "updated_at",
        "source",
        "kind",
        "status",
        "event_key",
        "order_id",
        "event_type",
        "occurred_at",
    )
    list_filter = ("kind", "status", "source", ("occurred_at", admin.DateFieldListFilter))
    search_fields = ("event_key__exact", "order_id__exact")
    exclude = ("sender_says", "we_hold")
    readonly_fields = (
        "source",
        "kind",
        "status",
        "event_key",
        "order_id",
        "event_type",
        "occurred_at",
        "pretty_sender_says",
        "pretty_we_hold",
        "first_run",
        "last_run",
        "created_at",
        "updated_at",
        "resolved_by",
        "resolved_at",
        "resolution_note",
    )

    @admin.display(description="the sender says")
    def pretty_sender_says(self, obj: RepairItem) -> str:
        return _pre(json.dumps(obj.sender_says, indent=2, sort_keys=True))

    @admin.display(description="we hold")
    def pretty_we_hold(self, obj: RepairItem) -> str:
        return _pre(json.dumps(obj.we_hold, indent=2, sort_keys=True))
