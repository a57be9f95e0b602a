"""The app's admin, one module per model, over a few shared pieces.

- base: ReadOnlyAdmin (every page of which shows a peer's invisible characters as
  escapes, through VisibleText), ObjectButtons (an action's button on a record's page)
  and StoredEventDisplay
- cells: how values look in lists and pages; forms: every form of the admin's;
  confirm: the one confirm-then-act flow of every operator action
- receipts, audit, failed_events (replay, discard): the receive side's records
- outbox_messages (retry now, discard), destinations (health, enable, recover…),
  recovery_jobs (plan, start, follow, cancel)
- sources (the sources kept as records: secrets by fingerprint, rotation)
- portal: the merchant portal's links, sessions (revoke) and their audit
- reconciliation_runs, repair_items (four repairs), silence
- overview (the overview page and its chart, chart.py) and trace (the trace page)

Importing the package registers every admin. ReadOnlyAdmin and StoredEventDisplay are
re-exported here so a host project's admin can build on them
(``from webhook_receiver.admin import ReadOnlyAdmin``).
"""

from __future__ import annotations

# imported for their @admin.register calls, which run on import
from . import (
    audit,
    destinations,
    failed_events,
    outbox_messages,
    overview,
    portal,
    receipts,
    reconciliation_runs,
    recovery_jobs,
    repair_items,
    silence,
    sources,
)
from .base import ReadOnlyAdmin, StoredEventDisplay

__all__ = ["ReadOnlyAdmin", "StoredEventDisplay"]
