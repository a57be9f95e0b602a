"""Headers stored before the signature redaction, redacted in the database.

Since signature headers are redacted at storage (core/storable.py, redacted_headers),
only rows stored before (or while KEEP_SIGNATURE_HEADERS was on) still hold them. The
admin shows them redacted either way; ``manage.py webhook_redact_headers`` removes them
from the rows, through ``stored_headers_redact``.

A command rather than a data migration: a receipts table can hold millions of rows, and
a migration would rewrite all of them in one transaction at deploy time, holding their
locks until it ends. Here each batch is one short transaction of its own, the work can
be stopped and run again at any time (a redacted row is left as it is), and the
receive path goes on meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import transaction

from ..core import storable
from .models import FailedEvent, WebhookReceipt

# the two models that keep a peer's headers
_Stored = TypeVar("_Stored", WebhookReceipt, FailedEvent)

DEFAULT_BATCH_SIZE = 500


@dataclass(frozen=True)
class Redaction:
    """What one table held: its rows, and those whose headers were (or would be)
    rewritten."""

    name: str
    rows: int
    redacted: int


def stored_headers_redact(
    *, batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False
) -> list[Redaction]:
    """Rewrite the headers of every receipt and failed event by today's rule: the
    credentials of REDACTED_HEADERS left out, every scheme's signature headers redacted
    (whatever KEEP_SIGNATURE_HEADERS says: running this is asking for it)."""
    return [
        _redact(WebhookReceipt, "receipts", batch_size=batch_size, dry_run=dry_run),
        _redact(FailedEvent, "failed events", batch_size=batch_size, dry_run=dry_run),
    ]


def redacted(headers: Any) -> Any:
    """``headers`` as the rule stores them; anything but a mapping as it is."""
    if not isinstance(headers, dict):
        return headers
    named = {str(name): str(value) for name, value in headers.items()}
    return storable.redacted_headers(named, keep_signatures=False)


def _redact(model: type[_Stored], name: str, *, batch_size: int, dry_run: bool) -> Redaction:
    rows = changed = 0
    for batch in _batches(model, batch_size):
        rows += len(batch)
        ids = [pk for pk, headers in batch if redacted(headers) != headers]
        changed += len(ids)
        if ids and not dry_run:
            _rewrite(model, ids)
    return Redaction(name=name, rows=rows, redacted=changed)


def _batches(model: type[_Stored], size: int) -> Iterator[list[tuple[int, Any]]]:
    """(id, headers) of every row, ``size`` at a time, in id order (an index range scan
    each: a keyset, never an offset)."""
    last = 0
    while True:
        batch = list(
            model.objects.filter(pk__gt=last).order_by("pk").values_list("pk", "headers")[:size]
        )
        if not batch:
            return
        yield batch
        last = batch[-1][0]


def _rewrite(model: type[_Stored], ids: list[int]) -> None:
    """One short transaction: the rows locked (a failed event's retry saves its whole row
    under the same lock, so neither overwrites the other), read again, rewritten."""
    with transaction.atomic():
        locked = list(
            model.objects.select_for_update().filter(pk__in=ids).order_by("pk").only("headers")
        )
        for row in locked:
            row.headers = redacted(row.headers)
        model.objects.bulk_update(locked, ["headers"])
