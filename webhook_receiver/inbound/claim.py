"""The claim: one transaction that records an event's key and applies its effect.

``INSERT`` the receipt with ``ON CONFLICT (source, event_key) DO NOTHING RETURNING id``
first; only when that insert claimed the key does the handler run. The receipt goes in
with the outcome most events end with; a handler whose result differs updates it before
the same transaction commits. If the handler raises, the claim rolls back with it, so a
later delivery can claim the key again. A receipt therefore exists if and only if its
effect committed. On PostgreSQL the claim statement also writes the delivery's audit
record (``WITH … INSERT``), so a new event costs no extra round trip for it. Every
statement is in ``queries.py``; they all take their parameters from one dict.

Every wait is bounded (LOCK_TIMEOUT_MS, STATEMENT_TIMEOUT_MS), from the delivery's first
statement on: the bounds travel with it in the same round trip (bounds.execute_bounded),
so a locked receipts table fails the delivery fast, to be captured as deferred.

The claim comes first, always, and answers duplicates too: there is one path. On
PostgreSQL, for a request, the receive path's own SQL is one statement: the claim,
which writes the audit record with the receipt, or, finding the key taken, returns the
receipt's stored outcome, records the delivery as a duplicate and, in a transaction of
our own, lets that commit go without waiting for its WAL flush. On SQLite the audit
record is a statement of its own, and so is a duplicate's read of its outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..core import bounds, sql, storable, tracing
from . import queries
from .audit import AuditDraft
from .handlers import HandlerResult, WebhookEvent, get_handler
from .models import FailedEvent, FailureStatus, RequestAudit, Result, WebhookReceipt


@dataclass(frozen=True)
class ReceiveOutcome:
    status: Result
    event_key: str
    # for a new event, what is stored on the receipt; for a duplicate, the first answer
    outcome: Mapping[str, Any] = field(default_factory=dict)


def event_claim_and_apply(
    *,
    event: WebhookEvent,
    body: bytes,
    headers: Mapping[str, str],
    audit: AuditDraft | None = None,
    received_at: datetime | None = None,
    resolve_failures: bool = True,
) -> ReceiveOutcome:
    """Apply ``event`` unless its key was already claimed; answer duplicates from the
    stored outcome. A success also resolves the key's open failed event, if any.

    ``audit``: the request's audit record, written by the same statements (retries and
    replays have none). ``received_at``: when a retried or replayed event first arrived,
    for its receipt (without a request, it is now): a replay of old dead letters is not
    traffic from the sender, for silence alerts and reconciliation's windows alike.
    """
    handler = get_handler(event.event_type, event.source)
    # The receipt goes in with the result most events end with (applied; ignored when no
    # handler exists), so that only a different result costs an UPDATE.
    expected = HandlerResult() if handler else _ignored(event)
    params = _params(
        event, body=body, headers=headers, result=expected, audit=audit, received_at=received_at
    )
    # one cursor for the delivery's statements, in the claim's transaction
    with connection.cursor() as cursor, transaction.atomic():
        claim = _claim(cursor, params, audited=audit is not None)
        if claim.receipt_id is None:
            # The key was claimed before, or by a concurrent delivery (ON CONFLICT
            # waited for it to commit): its outcome is readable now.
            stored = claim.stored_outcome
            if stored is None:  # SQLite, a retry or replay, or a receipt committed
                stored = _read_outcome(cursor, params)  # after the claim's snapshot
            if audit is not None and claim.audit_id is None:  # SQLite: not written yet
                cursor.execute(queries.INSERT_AUDIT, params | _DUPLICATE_AUDIT)
            return _duplicate(event, stored)

        if handler:
            with tracing.span("webhook.handler", event_type=event.event_type):
                result = handler(event) or expected
        else:
            result = expected
        if result != expected:
            params |= sql.adapt(_result_values(event, result), WebhookReceipt)
            params |= {"receipt_id": claim.receipt_id, "audit_id": claim.audit_id}
            cursor.execute(queries.UPDATE_RECEIPT_RESULT, params)
            if claim.audit_id is not None:
                cursor.execute(queries.UPDATE_AUDIT_RESULT, params)
        if resolve_failures and claim.has_open_failure:
            _resolve_open_failure(event, resolution=result.status)
        if audit is not None and claim.audit_id is None:  # SQLite: not written yet
            cursor.execute(queries.INSERT_AUDIT, params | {"response_status": 200})
    return ReceiveOutcome(
        status=result.status, event_key=event.event_key, outcome=_outcome(event, result)
    )


def _params(
    event: WebhookEvent,
    *,
    body: bytes,
    headers: Mapping[str, str],
    result: HandlerResult,
    audit: AuditDraft | None,
    received_at: datetime | None,
) -> dict[str, Any]:
    """The one dict of named parameters for every statement of this delivery: the
    receipt's columns with the expected result, and the audit record's, adapted once."""
    row = {
        "source": event.source,
        "event_key": event.event_key,
        "event_type": event.event_type,
        "message_id": storable.text(event.message_id or "", 255),
        "signature_timestamp": storable.moment(event.signature_timestamp),
        "body": body,
        "headers": storable.redacted_headers(headers),
        # the request's arrival, when there is one: the receipt and audit times agree
        "received_at": audit.received_at if audit is not None else received_at or timezone.now(),
        **_result_values(event, result),
        # the delivery's bounds (bounds.BOUND): they bound its first statement, and the
        # claim's whole transaction
        **bounds.configured_bounds(),
    }
    if audit is not None:
        row |= audit.claim_values()
    return sql.adapt(row, WebhookReceipt, RequestAudit)


def _result_values(event: WebhookEvent, result: HandlerResult) -> dict[str, Any]:
    """The receipt's and audit record's columns that depend on the handler's result."""
    return {
        "status": result.status,
        "result": result.status,  # the audit record's name for it
        "subject": storable.text(result.subject or event.subject, 255),
        "outcome": _outcome(event, result),
    }


# a duplicate's audit record, where the claim did not write it (SQLite)
_DUPLICATE_AUDIT = {"result": queries.DUPLICATE, "response_status": 200}


def _duplicate(event: WebhookEvent, stored: Mapping[str, Any]) -> ReceiveOutcome:
    return ReceiveOutcome(status=Result.DUPLICATE, event_key=event.event_key, outcome=stored)


def _ignored(event: WebhookEvent) -> HandlerResult:
    detail = {"event_type": event.event_type}
    if get_handler(event.event_type) is not None:  # bound to other sources (bound_to)
        detail["handler"] = "serves other sources"
    return HandlerResult(status=Result.IGNORED, detail=detail)


def _outcome(event: WebhookEvent, result: HandlerResult) -> dict[str, Any]:
    """What the receipt stores, the first delivery answers, and duplicates repeat."""
    outcome: dict[str, Any] = {"status": result.status.value, "event_key": event.event_key}
    if result.detail:
        outcome["detail"] = dict(result.detail)
    return outcome


def _read_outcome(cursor: CursorWrapper, params: Mapping[str, Any]) -> dict[str, Any]:
    """The stored outcome of a key the claim found taken (in the claim's transaction,
    under its bounds)."""
    cursor.execute(queries.READ_OUTCOME, params)
    found = cursor.fetchone()
    return {} if found is None else _stored_outcome(found[0])


def _stored_outcome(value: Any) -> dict[str, Any]:
    """A receipt's outcome column as the database driver returned it, decoded."""
    field = WebhookReceipt._meta.get_field("outcome")
    # no expression: a column read by hand (JSONField takes None; its stubs want one)
    return field.from_db_value(value, None, connection)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Claim:
    receipt_id: int | None  # None: the key was claimed already
    has_open_failure: bool  # the key is held as a failed event: this is its redelivery
    audit_id: int | None = None  # the audit record, when the claim statement wrote it
    stored_outcome: dict[str, Any] | None = None  # a duplicate's first answer, when read


def _claim(cursor: CursorWrapper, params: Mapping[str, Any], *, audited: bool) -> _Claim:
    """INSERT the receipt unless (source, event_key) exists; on PostgreSQL, with
    ``audited``, the same statement writes the audit record and reads a duplicate's
    stored outcome."""
    if connection.vendor != "postgresql":
        cursor.execute(queries.CLAIM_SQLITE, params)
        receipt_id, has_open_failure = cursor.fetchone() or (None, False)
        return _Claim(receipt_id, bool(has_open_failure))
    # the bounds go first, in the same round trip: they bound the claim's own wait for
    # the receipts table, then the rest of its transaction
    if not audited:
        bounds.execute_bounded(cursor, queries.CLAIM, params)
        receipt_id, has_open_failure = cursor.fetchone()
        return _Claim(receipt_id, has_open_failure)
    bounds.execute_bounded(cursor, queries.CLAIM_AUDITED, params)
    receipt_id, has_open_failure, audit_id, stored = cursor.fetchone()
    stored = _stored_outcome(stored) if stored is not None else None
    return _Claim(receipt_id, has_open_failure, audit_id, stored)


def _resolve_open_failure(event: WebhookEvent, *, resolution: str) -> None:
    """A redelivery succeeded for a key held as failed: resolve that record.

    A row locked by a sweeper or a replay is skipped rather than waited for (waiting
    would invert the lock order and could deadlock): that worker is running the same
    key, finds it applied, and resolves it as a duplicate.
    """
    ids = list(
        FailedEvent.objects.select_for_update(skip_locked=True)
        .filter(source=event.source, event_key=event.event_key, status__in=queries.OPEN)
        .values_list("id", flat=True)
    )
    if ids:
        failed_events_mark_resolved(ids, resolution=resolution, at=timezone.now())


def failed_events_mark_resolved(ids: list[int], *, resolution: str, at: datetime) -> None:
    """Mark these failed events resolved, as ``resolution``, at ``at``: nothing is due
    any more. The caller holds their row locks."""
    FailedEvent.objects.filter(id__in=ids).update(
        status=FailureStatus.RESOLVED,
        resolution=resolution,
        resolved_at=at,
        next_attempt_at=None,
        updated_at=timezone.now(),
    )
