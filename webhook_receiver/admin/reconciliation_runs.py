"""ReconciliationRun: each comparison of a source's sender records with ours, read-only;
what an operator looks for first (why it failed, or what it found) in the list."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..reconcile.models import ReconciliationRun, RunOutcome
from .base import ReadOnlyAdmin


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

    @admin.display(description=_("found"))
    def found(self, obj: ReconciliationRun) -> str:
        """What an operator looks for first: why it failed, or what it found."""
        if obj.outcome == RunOutcome.FAILED:
            return obj.error[:120]
        found = ", ".join(f"{n} {kind}" for kind, n in sorted(obj.counts.items()) if n)
        return found or gettext("nothing")
