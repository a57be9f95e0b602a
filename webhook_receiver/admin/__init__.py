"""The receiver's admin, one module per model.

- base: ReadOnlyAdmin (every page of which shows a peer's invisible characters as
  escapes, through VisibleText), StoredEventDisplay and the small display helpers they
  share
- receipts: WebhookReceipt
- audit: RequestAudit
- failed_events: FailedEvent, the one admin with operator actions (replay, discard)
- reconciliation: ReconciliationRun and RepairItem
- overview: the overview page (overview_page.py) and the trace page (trace.py)
- silence: SilenceAlert
- outbox: the outbox's OutboxMessage (retry now, discard) and WebhookDestination (health,
  recover since)

Importing the package registers every admin. ReadOnlyAdmin and StoredEventDisplay are
re-exported here so a host project's admin can build on them
(``from webhook_receiver.admin import ReadOnlyAdmin``).
"""

from __future__ import annotations

# imported for their @admin.register calls, which run on import
from . import (  # noqa: F401
    audit,
    destinations,
    failed_events,
    outbox_messages,
    overview,
    receipts,
    reconciliation_runs,
    repair_items,
    silence,
)
from .base import ReadOnlyAdmin, StoredEventDisplay

__all__ = ["ReadOnlyAdmin", "StoredEventDisplay"]
