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

from ..conf import app_settings
from ..handlers import HandlerResult, WebhookEvent, get_handler
from ..models import FailedEvent, FailureStatus, ReceiptStatus, WebhookReceipt
from . import sql
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

    handler = get_handler(event.event_type)
    # The receipt goes in with the result most events end with (applied; ignored when no
    # handler exists), so that only a different result costs an UPDATE.
    expected = HandlerResult() if handler else _ignored(event)
    with transaction.atomic():
        receipt_id = _claim(event, body=body, headers=headers, result=expected)
        if receipt_id is None:
            # A concurrent delivery claimed the key first; ON CONFLICT waited for it to
            # commit, so its outcome is readable now.
            return _duplicate(event, _lookup(event)[0] or {}, audit)
        result = (handler(event) or expected) if handler else expected
        if result != expected:
            sql.update(
                WebhookReceipt,
                receipt_id,
                {
                    "status": result.status,
                    "subject": (result.subject or event.subject)[:255],
                    "outcome": _outcome(event, result),
                },
            )
        if resolve_failures and has_open_failure:
            _resolve_open_failure(event, resolution=result.status.value)
        if audit is not None:
            audit.record(result=result.status.value, response_status=200)
    outcome = _outcome(event, result)
    return ReceiveOutcome(status=result.status.value, event_key=event.event_key, outcome=outcome)


def _ignored(event: WebhookEvent) -> HandlerResult:
    return HandlerResult(status=ReceiptStatus.IGNORED, detail={"event_type": event.event_type})


def _outcome(event: WebhookEvent, result: HandlerResult) -> dict[str, Any]:
    """What the receipt stores, the first delivery answers, and duplicates repeat."""
    outcome: dict[str, Any] = {"status": result.status.value, "event_key": event.event_key}
    if result.detail:
        outcome["detail"] = dict(result.detail)
    return outcome


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


def _claim(
    event: WebhookEvent, *, body: bytes, headers: Mapping[str, str], result: HandlerResult
) -> int | None:
    """INSERT the receipt unless (source, event_key) exists; return its id if we won."""
    timestamp = event.signature_timestamp
    row = {
        "source": event.source,
        "event_key": event.event_key,
        "event_type": event.event_type,
        "message_id": (event.message_id or "")[:255],
        "signature_timestamp": (
            datetime.fromtimestamp(timestamp, UTC) if timestamp is not None else None
        ),
        "status": result.status,
        "subject": (result.subject or event.subject)[:255],
        "outcome": _outcome(event, result),
        "body": body,
        "headers": storable_headers(headers),
        "received_at": timezone.now(),
    }
    claimed = sql.insert(WebhookReceipt, [row], conflict=("source", "event_key"), returning="id")
    return claimed[0][0] if claimed else None


def storable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers worth keeping with an event: all but credentials (REDACTED_HEADERS)."""
    redacted = app_settings().redacted_headers
    return {name: value for name, value in headers.items() if name.lower() not in redacted}
