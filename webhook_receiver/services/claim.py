"""The claim: one transaction that records an event's key and applies its effect.

``INSERT`` the receipt with ``ON CONFLICT (source, event_key) DO NOTHING RETURNING id``
first; only when that insert claimed the key does the handler run, and its outcome is
stored on the receipt before the same transaction commits. If the handler raises, the
claim rolls back with it, so a later delivery can claim the key again. A receipt
therefore exists if and only if its effect committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ..handlers import HandlerResult, WebhookEvent, get_handler
from ..models import FailedEvent, FailureStatus, ReceiptStatus, WebhookReceipt
from .audit import AuditDraft

DUPLICATE = "duplicate"
OPEN_FAILURES = (FailureStatus.RETRYING, FailureStatus.DEAD, FailureStatus.DISCARDED)


@dataclass(frozen=True)
class ReceiveOutcome:
    status: str  # applied | stale | ignored | duplicate | deferred | dead_lettered
    event_key: str
    # for a new event, what is stored on the receipt; for a duplicate, the first answer
    outcome: Mapping[str, Any] = field(default_factory=dict)


def event_claim_and_apply(
    *,
    event: WebhookEvent,
    body: bytes,
    headers: Mapping[str, str],
    audit: AuditDraft | None = None,
    resolve_failures: bool = True,
) -> ReceiveOutcome:
    """Apply ``event`` unless its key was already claimed; answer duplicates from the
    stored outcome. A success also resolves the key's open failed event, if any.
    """
    # A cheap read answers most duplicates without a write transaction. It is not the
    # guard: a miss goes on to the claim, and only the claim decides to apply.
    stored, has_open_failure = _lookup(event)
    if stored is not None:
        return _duplicate(event, stored, audit)

    with transaction.atomic():
        receipt_id = _claim(event, body=body, headers=headers)
        if receipt_id is None:
            # A concurrent delivery claimed the key first; ON CONFLICT waited for it to
            # commit, so its outcome is readable now.
            return _duplicate(event, _lookup(event)[0] or {}, audit)
        result = _run_handler(event)
        outcome = {"status": result.status.value, "event_key": event.event_key}
        if result.detail:
            outcome["detail"] = dict(result.detail)
        WebhookReceipt.objects.filter(pk=receipt_id).update(
            status=result.status, subject=result.subject[:255], outcome=outcome
        )
        if resolve_failures and has_open_failure:
            _resolve_open_failure(event, resolution=result.status.value)
        if audit is not None:
            audit.record(result=result.status.value, response_status=200)
    return ReceiveOutcome(status=result.status.value, event_key=event.event_key, outcome=outcome)


def _run_handler(event: WebhookEvent) -> HandlerResult:
    handler = get_handler(event.event_type)
    if handler is None:
        return HandlerResult(status=ReceiptStatus.IGNORED, detail={"event_type": event.event_type})
    return handler(event) or HandlerResult()


def _duplicate(
    event: WebhookEvent, stored: Mapping[str, Any], audit: AuditDraft | None
) -> ReceiveOutcome:
    if audit is not None:
        audit.record(result=DUPLICATE, response_status=200)
    return ReceiveOutcome(status=DUPLICATE, event_key=event.event_key, outcome=stored)


def _lookup(event: WebhookEvent) -> tuple[dict[str, Any] | None, bool]:
    """The key's stored outcome, if it has a receipt, and whether it has an open failed
    event: one round trip that the hot path pays anyway."""
    receipts = connection.ops.quote_name(WebhookReceipt._meta.db_table)
    failures = connection.ops.quote_name(FailedEvent._meta.db_table)
    key = [event.source, event.event_key]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT outcome FROM {receipts} WHERE source = %s AND event_key = %s), "
            f"EXISTS (SELECT 1 FROM {failures} WHERE source = %s AND event_key = %s "
            "AND status IN (%s, %s, %s))",
            [*key, *key, *OPEN_FAILURES],
        )
        outcome, has_open_failure = cursor.fetchone()
    if outcome is not None:
        outcome = WebhookReceipt._meta.get_field("outcome").from_db_value(outcome, None, connection)
    return outcome, bool(has_open_failure)


def _resolve_open_failure(event: WebhookEvent, *, resolution: str) -> None:
    """A redelivery succeeded for a key held as failed: resolve that record.

    A row locked by a sweeper or a replay is skipped rather than waited for (waiting
    would invert the lock order and could deadlock): that worker is running the same
    key, finds it applied, and resolves it as a duplicate.
    """
    ids = list(
        FailedEvent.objects.select_for_update(skip_locked=True)
        .filter(source=event.source, event_key=event.event_key, status__in=OPEN_FAILURES)
        .values_list("id", flat=True)
    )
    if ids:
        now = timezone.now()
        FailedEvent.objects.filter(id__in=ids).update(
            status=FailureStatus.RESOLVED,
            resolution=resolution,
            resolved_at=now,
            next_attempt_at=None,
            updated_at=now,
        )


def _claim(event: WebhookEvent, *, body: bytes, headers: Mapping[str, str]) -> int | None:
    """INSERT the receipt unless (source, event_key) exists; return its id if we won."""
    fields = {f.name: f for f in WebhookReceipt._meta.concrete_fields}
    timestamp = event.signature_timestamp
    values = {
        "source": event.source,
        "event_key": event.event_key,
        "event_type": event.event_type,
        "message_id": (event.message_id or "")[:255],
        "signature_timestamp": (
            datetime.fromtimestamp(timestamp, UTC) if timestamp is not None else None
        ),
        # provisional; the outcome replaces it before the transaction commits
        "status": ReceiptStatus.APPLIED,
        "subject": "",
        "outcome": {},
        "body": body,
        "headers": dict(headers),
        "received_at": timezone.now(),
    }
    columns = ", ".join(connection.ops.quote_name(fields[name].column) for name in values)
    params = [fields[name].get_db_prep_save(value, connection) for name, value in values.items()]
    table = connection.ops.quote_name(WebhookReceipt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(values))}) "
            "ON CONFLICT (source, event_key) DO NOTHING RETURNING id",
            params,
        )
        row = cursor.fetchone()
    return row[0] if row else None
