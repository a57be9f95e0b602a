"""The claim: one transaction that records an event's key and applies its effect.

``INSERT`` the receipt with ``ON CONFLICT (source, event_key) DO NOTHING RETURNING id``
first; only when that insert claimed the key does the handler run. The receipt goes in
with the outcome most events end with; a handler whose result differs updates it before
the same transaction commits. If the handler raises, the claim rolls back with it, so a
later delivery can claim the key again. A receipt therefore exists if and only if its
effect committed. On PostgreSQL the claim statement also writes the delivery's audit
record (``WITH … INSERT``), so a new event costs no extra round trip for it.

A duplicate can be answered two ways, equally correct: by a read before the claim (one
statement, no transaction, but a wasted round trip for every new event), or by the
claim itself, which then finds the key taken. ``DuplicateShare`` picks the cheaper
order for the recent traffic of each source (setting ``DUPLICATE_CHECK``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from ..conf import app_settings
from ..handlers import HandlerResult, WebhookEvent, get_handler
from ..models import FailedEvent, FailureStatus, RequestAudit, Result, WebhookReceipt
from . import sql
from .audit import ANSWER, AuditDraft, AuditValues

DUPLICATE = Result.DUPLICATE.value  # a plain str: psycopg dumps it faster
# On PostgreSQL a duplicate's audit record is committed without waiting for its WAL
# flush (synchronous_commit off for that one transaction): it changes no business state,
# so a database crash could lose at most the last fraction of a second of such records,
# never a receipt or an effect. Its sender is answered without paying for a disk flush.
# Only in a transaction of our own: a caller's transaction keeps its durability.
RELAXED_COMMIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"
OPEN_FAILURES = tuple(
    status.value for status in (FailureStatus.RETRYING, FailureStatus.DEAD, FailureStatus.DISCARDED)
)
# Where one statement may insert into two tables (``WITH … INSERT``); SQLite cannot.
WRITABLE_CTE_VENDORS = frozenset({"postgresql"})


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
    resolve_failures: bool = True,
) -> ReceiveOutcome:
    """Apply ``event`` unless its key was already claimed; answer duplicates from the
    stored outcome. A success also resolves the key's open failed event, if any.
    """
    audit_values = audit.values() if audit is not None else None
    relax = connection.vendor == "postgresql" and not connection.in_atomic_block
    with connection.cursor() as cursor:  # one cursor for both statements: it is not free
        # Read first (while duplicates are common, see DuplicateShare): one statement
        # answers a duplicate and writes its audit record. It is not the guard: a miss
        # goes on to the claim, which alone decides.
        if duplicate_share.read_first(event.source):
            stored = _duplicate_outcome(cursor, event, audit_values, relax=relax)
            if stored is not None:
                duplicate_share.observe(event.source, duplicate=True, counts=audit is not None)
                return ReceiveOutcome(
                    status=Result.DUPLICATE, event_key=event.event_key, outcome=stored
                )

        handler = get_handler(event.event_type)
        # The receipt goes in with the result most events end with (applied; ignored when
        # no handler exists), so that only a different result costs an UPDATE.
        expected = HandlerResult() if handler else _ignored(event)
        with transaction.atomic():
            claim = _claim(
                cursor,
                event,
                body=body,
                headers=headers,
                result=expected,
                audit=audit_values,
                relax=relax,
            )
            duplicate_share.observe(
                event.source, duplicate=claim.receipt_id is None, counts=audit is not None
            )
            if claim.receipt_id is None:
                # The key was claimed before, or by a concurrent delivery (ON CONFLICT
                # waited for it to commit): its outcome is readable now.
                stored = claim.stored_outcome
                if stored is None:
                    audit_left = None if claim.audit_id is not None else audit_values
                    stored = _duplicate_outcome(cursor, event, audit_left, relax=relax) or {}
                return ReceiveOutcome(
                    status=Result.DUPLICATE, event_key=event.event_key, outcome=stored
                )
            result = (handler(event) or expected) if handler else expected
            if result != expected:
                sql.update(
                    WebhookReceipt,
                    claim.receipt_id,
                    {
                        "status": result.status,
                        "subject": (result.subject or event.subject)[:255],
                        "outcome": _outcome(event, result),
                    },
                )
            if resolve_failures and claim.has_open_failure:
                _resolve_open_failure(event, resolution=result.status.value)
            if audit is not None:
                if claim.audit_id is None:
                    audit.record(result=result.status.value, response_status=200)
                elif result != expected:
                    sql.update(RequestAudit, claim.audit_id, {"result": result.status.value})
    outcome = _outcome(event, result)
    return ReceiveOutcome(status=result.status, event_key=event.event_key, outcome=outcome)


def _ignored(event: WebhookEvent) -> HandlerResult:
    return HandlerResult(status=Result.IGNORED, detail={"event_type": event.event_type})


def _outcome(event: WebhookEvent, result: HandlerResult) -> dict[str, Any]:
    """What the receipt stores, the first delivery answers, and duplicates repeat."""
    outcome: dict[str, Any] = {"status": result.status.value, "event_key": event.event_key}
    if result.detail:
        outcome["detail"] = dict(result.detail)
    return outcome


def _duplicate_outcome(
    cursor: CursorWrapper, event: WebhookEvent, audit: AuditValues | None, *, relax: bool
) -> dict[str, Any] | None:
    """The stored outcome of a key that has a receipt, else None.

    With an audit record to write, one statement does both halves of a duplicate's work: it inserts
    the delivery's audit record only if the key has a receipt, and returns that receipt's
    outcome. For a new key it writes nothing.
    """
    key = [event.source, event.event_key]
    if audit is None:  # a retry or a replay: nothing to record here
        statement, params = _outcome_sql(), key
    else:
        names, audit_params = audit.with_answer(DUPLICATE, 200)
        statement = _duplicate_sql(names, relax)
        params = [*audit_params, *key, *key]
    cursor.execute(statement, params)
    found = cursor.fetchone()
    return None if found is None else _stored_outcome(found[0])


def _stored_outcome(value: Any) -> dict[str, Any]:
    """A receipt's outcome column as the database driver returned it, decoded."""
    return WebhookReceipt._meta.get_field("outcome").from_db_value(value, None, connection)


@functools.cache
def _outcome_sql() -> str:
    receipts = sql.table(WebhookReceipt)
    return f"SELECT outcome FROM {receipts} WHERE source = %s AND event_key = %s"


@functools.cache
def _duplicate_sql(names: tuple[str, ...], relax: bool) -> str:
    receipts = sql.table(WebhookReceipt)
    return (
        f"INSERT INTO {sql.table(RequestAudit)} ({sql.columns(RequestAudit, names)}) "
        f"SELECT {sql.placeholders(len(names))} "
        f"WHERE EXISTS (SELECT 1 FROM {receipts} WHERE source = %s AND event_key = %s)"
        f"{f' AND {RELAXED_COMMIT}' if relax else ''} "
        f"RETURNING (SELECT outcome FROM {receipts} WHERE source = %s AND event_key = %s)"
    )


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


@dataclass(frozen=True)
class _Claim:
    receipt_id: int | None  # None: the key was claimed already
    has_open_failure: bool  # the key is held as a failed event: this is its redelivery
    audit_id: int | None  # the audit record, when the claim statement wrote it too
    stored_outcome: dict[str, Any] | None  # a duplicate's first answer, when it was read


def _claim(
    cursor: CursorWrapper,
    event: WebhookEvent,
    *,
    body: bytes,
    headers: Mapping[str, str],
    result: HandlerResult,
    audit: AuditValues | None,
    relax: bool,
) -> _Claim:
    """INSERT the receipt unless (source, event_key) exists.

    On PostgreSQL the same statement also writes the delivery's audit record: with the
    expected result if the receipt went in, else as a duplicate, whose stored outcome it
    also reads and whose transaction it lets commit without waiting for the WAL flush.
    """
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
    names = tuple(row)
    params = sql.params(WebhookReceipt, names, row)
    key = [event.source, event.event_key]
    audit_names: tuple[str, ...] = ()
    if audit is not None and connection.vendor in WRITABLE_CTE_VENDORS:
        audit_names = audit.names
        params += [*audit.params, result.status.value, *key]
    cursor.execute(_claim_sql(names, audit_names, relax), [*params, *key, *OPEN_FAILURES])
    # SQLite's RETURNING gives no row when the insert did nothing
    receipt_id, has_open_failure, audit_id, stored = cursor.fetchone() or (None, 0, None, None)
    if stored is not None:
        stored = _stored_outcome(stored)
    return _Claim(receipt_id, bool(has_open_failure), audit_id, stored)


@functools.cache
def _claim_sql(names: tuple[str, ...], audit_names: tuple[str, ...], relax: bool) -> str:
    receipts = sql.table(WebhookReceipt)
    insert_receipt = (
        f"INSERT INTO {receipts} ({sql.columns(WebhookReceipt, names)}) "
        f"VALUES ({sql.placeholders(len(names))}) "
        "ON CONFLICT (source, event_key) DO NOTHING RETURNING id"
    )
    open_failure = (
        f"EXISTS (SELECT 1 FROM {sql.table(FailedEvent)} "
        "WHERE source = %s AND event_key = %s AND status IN (%s, %s, %s))"
    )
    if not audit_names:
        return (
            f"WITH claimed AS ({insert_receipt}) "
            f"SELECT (SELECT id FROM claimed), {open_failure}, NULL, NULL"
            if connection.vendor in WRITABLE_CTE_VENDORS
            else f"{insert_receipt}, {open_failure}, NULL, NULL"
        )
    lost = "NOT EXISTS (SELECT 1 FROM claimed)"
    # The stored outcome is read from the statement's snapshot: a receipt committed by a
    # concurrent claim is not in it (NULL here; the caller reads it again).
    return (
        f"WITH claimed AS ({insert_receipt}), "
        f"audited AS (INSERT INTO {sql.table(RequestAudit)} "
        f"({sql.columns(RequestAudit, (*audit_names, *ANSWER))}) "
        f"SELECT {sql.placeholders(len(audit_names))}, "
        f"CASE WHEN {lost} THEN '{DUPLICATE}' ELSE %s END, 200 RETURNING id), "
        f"stored AS (SELECT outcome FROM {receipts} "
        f"WHERE {lost} AND source = %s AND event_key = %s) "
        f"SELECT (SELECT id FROM claimed), {open_failure}, (SELECT id FROM audited), "
        f"(SELECT outcome FROM stored{f' WHERE {RELAXED_COMMIT}' if relax else ''})"
    )


class DuplicateShare:
    """Per process and source, the share of recent deliveries that were duplicates,
    weighted over about the last ``1 / WEIGHT`` of them; it decides whether a delivery
    starts by reading (DUPLICATE_CHECK "adaptive").

    Reading first costs a new event one statement more and answers a duplicate with one
    statement and no transaction; claiming first is the other way round. Most traffic
    is new events, so the claim goes first; during a redelivery storm (a sender
    replaying its backlog after an outage) duplicates are the majority and the read
    goes first. Both orders are correct: the claim is the guard either way. Updated
    without a lock: a lost update only nudges a heuristic.
    """

    WEIGHT = 1 / 16

    def __init__(self) -> None:
        self._shares: dict[str, float] = {}

    def read_first(self, source: str) -> bool:
        mode = app_settings().duplicate_check
        if mode != "adaptive":
            return mode == "read_first"
        return self._shares.get(source, 0.0) >= 0.5

    def observe(self, source: str, *, duplicate: bool, counts: bool = True) -> None:
        """Record one delivery's answer (``counts``: retries and replays do not)."""
        if counts:
            share = self._shares.get(source, 0.0)
            self._shares[source] = share + self.WEIGHT * (float(duplicate) - share)


duplicate_share = DuplicateShare()


def storable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers worth keeping with an event: all but credentials (REDACTED_HEADERS)."""
    redacted = app_settings().redacted_headers
    return {name: value for name, value in headers.items() if name.lower() not in redacted}
