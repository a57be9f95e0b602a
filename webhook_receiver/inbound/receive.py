"""The receive path: verify, then claim and apply in one transaction.

``webhook_receive`` is the one entry point the view calls. Its steps:

1. Look up the source (the settings, then the records: sources/lookup.py) and read the
   body, enforcing the size limit while reading.
2. Verify the signature over the raw bytes (a pure function, no database).
3. Parse the verified body and derive the event key.
4. ``event_claim_and_apply`` (inbound/claim.py): claim the key and apply the effect in
   ONE transaction.
5. If 3 or 4 fails, the claim has rolled back: capture the verified event as a failed
   event, in a transaction of its own, for retry or replay (inbound/failures.py).

Every request leaves a ``RequestAudit`` record whatever its fate, but for refused ones
beyond the audit bound, which their minute's ``RejectionTally`` counts (inbound/audit.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import IO

from django.db import transaction
from django.utils import timezone
from django.utils.datastructures import CaseInsensitiveMapping

from .. import schemes
from ..conf import app_settings
from ..core import logs, outages, storable, tracing
from ..core.fingerprints import secret_fingerprint
from ..exceptions import (
    NotStored,
    PayloadTooLarge,
    RejectedRequest,
    TimestampOutOfTolerance,
    UnknownSource,
)
from ..sources.lookup import SourceUnreadable, source_known, source_lookup
from .audit import AuditDraft
from .claim import ReceiveOutcome, event_claim_and_apply
from .events import parse_event
from .failures import CapturedEvent, failure_capture
from .handlers import WebhookEvent
from .models import FailureStatus, Result

logger = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
MAX_RECORDED_SIZE = 2**31 - 1


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
    audit record). A verified event that cannot be applied now is captured as a failed
    event and answered ``deferred`` (transient) or ``dead_lettered`` (permanent). Only
    when even that capture fails (the database is down) does it raise ``NotStored``, so
    that the sender keeps the event and retries.

    With OpenTelemetry, in a ``webhook.receive`` span, child of the request's
    ``traceparent`` (core/tracing.py).
    """
    with tracing.span(
        "webhook.receive", kind=tracing.SERVER, headers=headers, source=source_slug
    ) as span:
        outcome = _receive(
            source_slug=source_slug,
            stream=stream,
            content_length=content_length,
            headers=headers,
            remote_addr=remote_addr,
        )
        tracing.annotate(span, event_key=outcome.event_key, result=outcome.status)
        return outcome


def _receive(
    *,
    source_slug: str,
    stream: IO[bytes] | None,
    content_length: int | None,
    headers: Mapping[str, str],
    remote_addr: str | None,
) -> ReceiveOutcome:
    audit = AuditDraft(source=source_slug, received_at=timezone.now(), remote_addr=remote_addr)
    if not isinstance(headers, CaseInsensitiveMapping):  # request.headers already is one
        headers = CaseInsensitiveMapping(headers)
    # what was announced, until a body is read; clamped so an absurd header still fits
    audit.body_size = min(content_length, MAX_RECORDED_SIZE) if content_length else None
    try:
        # settings first (no query); a record from the per-process snapshot. A disabled
        # record is answered as an unknown slug is.
        try:
            source = source_lookup(source_slug)
        except SourceUnreadable as exc:
            logs.log_line(
                logger,
                logging.ERROR,
                "webhook request not verified: its source record's secrets cannot be "
                "read; answered 503, the sender will retry",
                source=source_slug,
                state=exc.state,
            )
            raise
        if source is None:
            raise UnknownSource()
        body = read_limited_body(stream, content_length, source.max_body_bytes)
        audit.set_body(body)
        with tracing.span("webhook.verify", scheme=source.scheme):
            message = schemes.verify(
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
            secrets = source.secrets if source is not None else ()
            audit.secret_fingerprint = _fingerprint(secrets, exc.verified)
        audit.verification = exc.code
        # The refusal stands whether or not its record can be written: an unauthenticated
        # request never turns into a 5xx. A log line stands in for a record not written.
        written, error = audit.record_best_effort(result=exc.code, response_status=exc.status_code)
        if error is not None:
            outages.connection_discard_if_broken(error)
            fields = audit.log_fields(result=exc.code, response_status=exc.status_code)
            logs.log_failure(logger, "audit record not written", error, **fields)
        else:
            _refusal_log(audit, exc, written=written)
        raise
    audit.message_id = message.message_id or ""
    audit.signature_timestamp = message.timestamp
    audit.secret_fingerprint = _fingerprint(source.secrets, message)

    event: WebhookEvent | None = None
    try:
        event = parse_event(source, message, headers, body)
        audit.event_key = event.event_key
        with tracing.span("webhook.claim", event_key=event.event_key, event_type=event.event_type):
            return event_claim_and_apply(event=event, body=body, headers=headers, audit=audit)
    except Exception as exc:
        # The claim has rolled back. Keep the verified event, in a transaction of its own.
        captured = CapturedEvent(
            source=source.slug,
            event_key=event.event_key if event else _fallback_key(message, body),
            event_type=event.event_type if event else "",
            message_id=message.message_id or "",
            signature_timestamp=message.timestamp,
            body=body,
            headers=storable.redacted_headers(headers),
        )
        audit.event_key = captured.event_key
        try:
            with transaction.atomic():
                failed = failure_capture(captured=captured, exc=exc)
                dead = failed.status == FailureStatus.DEAD
                status = Result.DEAD_LETTERED if dead else Result.DEFERRED
                audit.record(result=status, response_status=202)
        except Exception as capture_error:
            # Nothing was stored: the sender keeps the event and retries. One log line,
            # with the audit record's fields when even that could not be written.
            result = type(exc).__name__
            _, unwritten = audit.record_best_effort(result=result, response_status=503)
            outages.connection_discard_if_broken(capture_error)
            logs.log_failure(
                logger,
                "webhook neither applied nor captured; the sender will retry",
                capture_error,
                first_error=logs.error_name(exc),
                audit_written=unwritten is None,
                **audit.log_fields(result=result, response_status=503),
            )
            raise NotStored() from None
        return ReceiveOutcome(status=status, event_key=captured.event_key)


# per process: each (tallied source, reason) says once a minute that its refusals went
# past the audit bound (configured sources and a fixed set of reasons: a bounded dict)
_past_bound_said = logs.SaidOnce(every=60)


def _refusal_log(audit: AuditDraft, exc: RejectedRequest, *, written: bool) -> None:
    """One line per refusal that the audit records; beyond the audit bound (a flood), one
    line a minute per source and reason (and process) says that the rest are counted
    only: the log stays as bounded as the table."""
    if written:
        logs.log_line(
            logger,
            logging.WARNING,
            "webhook refused",
            source=audit.source,
            reason=exc.code,
            status=exc.status_code,
            message_id=audit.message_id or None,
            remote_addr=audit.remote_addr,
            body_sha256=audit.body_sha256 or None,
        )
        return
    source = audit.source if source_known(audit.source) else ""
    # the bound counts per minute of the clock: a stretch is one, not any 60 s
    minute = audit.received_at.replace(second=0, microsecond=0)
    if not _past_bound_said.met((source, exc.code), now=minute.timestamp()):
        return
    logs.log_line(
        logger,
        logging.WARNING,
        "webhook refusals past the audit bound: counted, not recorded, this minute",
        source=source or "(not configured)",
        reason=exc.code,
        recorded_per_minute=app_settings().rejected_audit_per_minute,
    )


def _fingerprint(secrets: tuple[str, ...], message: schemes.VerifiedMessage) -> str | None:
    """The fingerprint of the secret that verified ``message`` (never the secret), when
    its scheme says which one did."""
    index = message.secret_index
    if index is None or not 0 <= index < len(secrets):
        return None
    return secret_fingerprint(secrets[index])


def _fallback_key(message: schemes.VerifiedMessage, body: bytes) -> str:
    """A key for an event whose own key could not be derived (e.g. unparsable body)."""
    if message.message_id:
        return storable.key(message.message_id)
    return f"{storable.DIGEST_PREFIX}{hashlib.sha256(body).hexdigest()}"


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
