"""The receive path: verify, then claim and apply in one transaction.

``webhook_receive`` is the one entry point the view calls. Its steps:

1. Look up the source and read the body, enforcing the size limit while reading.
2. Verify the signature over the raw bytes (a pure function, no database).
3. Parse the verified body and derive the event key.
4. ``event_claim_and_apply``: in ONE transaction, ``INSERT`` the receipt with
   ``ON CONFLICT (source, event_key) DO NOTHING RETURNING id``; only when that insert
   claimed the key, run the handler and store its outcome on the receipt. If the
   handler raises, the claim rolls back with it, so a later delivery can claim again.

Every request leaves a ``RequestAudit`` record whatever its fate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.datastructures import CaseInsensitiveMapping
from django.utils.module_loading import import_string

from .. import signatures
from ..conf import SourceConfig, app_settings, get_source
from ..exceptions import (
    InvalidPayload,
    PayloadTooLarge,
    RejectedRequest,
    TimestampOutOfTolerance,
    UnknownSource,
    WebhookError,
)
from ..handlers import HandlerResult, WebhookEvent, get_handler
from ..models import ReceiptStatus, WebhookReceipt
from .audit import AuditDraft

logger = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
MAX_RECORDED_SIZE = 2**31 - 1
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class ReceiveOutcome:
    status: str  # applied | stale | ignored | duplicate
    event_key: str
    # for a new event, what is stored on the receipt; for a duplicate, the first answer
    outcome: Mapping[str, Any] = field(default_factory=dict)


def webhook_receive(
    *,
    source_slug: str,
    stream: IO[bytes] | None,
    content_length: int | None,
    headers: Mapping[str, str],
    remote_addr: str | None = None,
) -> ReceiveOutcome:
    """Verify one webhook request and apply its event at most once.

    Raises a ``RejectedRequest`` when the request is refused (nothing stored but the
    audit record), or a ``WebhookError`` / database error when a verified event could
    not be processed (the claim is rolled back; the sender's redelivery can succeed).
    """
    audit = AuditDraft(source=source_slug, received_at=timezone.now(), remote_addr=remote_addr)
    headers = CaseInsensitiveMapping(headers)
    # what was announced, until a body is read; clamped so an absurd header still fits
    audit.body_size = min(content_length, MAX_RECORDED_SIZE) if content_length else None
    try:
        source = get_source(source_slug)
        if source is None:
            raise UnknownSource()
        body = read_limited_body(stream, content_length, source.max_body_bytes)
        audit.set_body(body)
        message = signatures.verify(
            scheme=source.scheme,
            secrets=source.secrets,
            headers=headers,
            body=body,
            tolerance_seconds=source.tolerance_seconds,
        )
    except RejectedRequest as exc:
        if isinstance(exc, TimestampOutOfTolerance) and exc.verified is not None:
            # authentic but late (or early): worth knowing which delivery it was
            audit.message_id = exc.verified.message_id or ""
            audit.signature_timestamp = exc.verified.timestamp
        audit.verification = exc.code
        audit.record(result=exc.code, response_status=exc.status_code)
        raise
    audit.message_id = message.message_id or ""
    audit.signature_timestamp = message.timestamp

    try:
        event = parse_event(source, message, headers, body)
        audit.event_key = event.event_key
        return event_claim_and_apply(
            event=event, body=body, headers=storable_headers(headers), audit=audit
        )
    except Exception as exc:
        # the claim transaction has rolled back; the audit record goes in on its own
        status = exc.status_code if isinstance(exc, WebhookError) else 503
        code = exc.code if isinstance(exc, WebhookError) else type(exc).__name__
        audit.record_best_effort(result=code, response_status=status)
        raise


def read_limited_body(stream: IO[bytes] | None, content_length: int | None, limit: int) -> bytes:
    """Read at most ``limit`` bytes; refuse from Content-Length first, then while reading."""
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge()
    if stream is None:
        return b""
    chunks, size = [], 0
    while chunk := stream.read(min(READ_CHUNK, limit + 1 - size)):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def storable_headers(headers: Mapping[str, str]) -> dict[str, str]:
    redacted = app_settings().redacted_headers
    return {name: value for name, value in headers.items() if name.lower() not in redacted}


def parse_event(
    source: SourceConfig,
    message: signatures.VerifiedMessage,
    headers: Mapping[str, str],
    body: bytes,
) -> WebhookEvent:
    """Parse a verified body into a ``WebhookEvent``; raise ``InvalidPayload`` if unusable."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidPayload(f"The body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidPayload("The body must be a JSON object.")
    if message.scheme == "github":
        event_type = headers.get("X-GitHub-Event") or ""  # headers: case-insensitive
    else:
        event_type = payload.get("type")
        if not isinstance(event_type, str) or not event_type:
            raise InvalidPayload("The body has no 'type' string.")
    key = _event_key(source, message, payload)
    return WebhookEvent(
        source=source.slug,
        event_key=key,
        event_type=event_type[:255],
        payload=payload,
        message_id=message.message_id,
        signature_timestamp=message.timestamp,
    )


def _event_key(
    source: SourceConfig, message: signatures.VerifiedMessage, payload: dict[str, Any]
) -> str:
    if source.event_key:
        derive: Callable[..., Any] = import_string(source.event_key)
        key = derive(payload=payload, message=message)
    elif message.scheme == "stripe":
        key = payload.get("id")  # Stripe's event id lives in the signed body
    else:
        key = message.message_id
    if not isinstance(key, str) or not key or len(key) > 255:
        raise InvalidPayload("No event key (a string of 1 to 255 characters) could be derived.")
    return key


def event_claim_and_apply(
    *,
    event: WebhookEvent,
    body: bytes,
    headers: Mapping[str, str],
    audit: AuditDraft | None = None,
) -> ReceiveOutcome:
    """Apply ``event`` unless its key was already claimed; answer duplicates from the
    stored outcome.
    """
    # A cheap read answers most duplicates without a write transaction. It is not the
    # guard: a miss goes on to the claim, and only the claim decides to apply.
    stored = _stored_outcome(event)
    if stored is not None:
        return _duplicate(event, stored, audit)

    with transaction.atomic():
        receipt_id = _claim(event, body=body, headers=headers)
        if receipt_id is None:
            # A concurrent delivery claimed the key first; ON CONFLICT waited for it to
            # commit, so its outcome is readable now.
            return _duplicate(event, _stored_outcome(event) or {}, audit)
        result = _run_handler(event)
        outcome = {"status": result.status.value, "event_key": event.event_key}
        if result.detail:
            outcome["detail"] = dict(result.detail)
        WebhookReceipt.objects.filter(pk=receipt_id).update(
            status=result.status, subject=result.subject[:255], outcome=outcome
        )
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


def _stored_outcome(event: WebhookEvent) -> dict[str, Any] | None:
    return (
        WebhookReceipt.objects.filter(source=event.source, event_key=event.event_key)
        .values_list("outcome", flat=True)
        .first()
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
