"""Failed events: durable capture, bounded retries, dead letters and deliberate replay.

A verified event whose processing failed is never lost: after its claim transaction
rolled back, ``failure_capture`` stores it, in a transaction of its own, with the raw
bytes, headers and the error. Transient failures are retried with exponential backoff
and full jitter; the schedule is ``FailedEvent.next_attempt_at``, swept by
``retry_failed_events`` with ``SELECT … FOR UPDATE SKIP LOCKED``. Permanent
failures, and transient ones that ran out of attempts, are ``dead`` until an operator
replays or discards them.

Every retry and replay goes through ``event_claim_and_apply`` with the original key
and the stored bytes, without verifying the signature again (it was verified, and
audited, at receipt; its timestamp is long outside the tolerance by now). The claim
stays the idempotency guard, so a replay of an applied key resolves as a duplicate.

Lock order, everywhere: the failed-event row first, then the receipt key.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DataError, transaction
from django.utils import timezone
from django.utils.datastructures import CaseInsensitiveMapping

from ..conf import app_settings
from ..core import bounds, logs, storable
from ..core.backoff import full_jitter
from ..core.retention import delete_in_batches
from ..exceptions import InvalidPayload, PermanentError
from ..schemes import VerifiedMessage
from ..sources.lookup import source_lookup
from .claim import event_claim_and_apply, failed_events_mark_resolved
from .events import parse_event
from .handlers import WebhookEvent, subject_of
from .models import FailedEvent, FailureStatus, Result

logger = logging.getLogger(__name__)

TRANSIENT = "transient"
PERMANENT = "permanent"

MAX_TRACEBACK_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000


# Errors that the same event meets on every attempt, whoever raises them: the database
# refusing a value (too long, NUL, out of range, not a number: DataError), nesting too
# deep to walk, text that cannot be encoded. Retrying them only delays the dead letter.
ALWAYS_RECUR: tuple[type[BaseException], ...] = (
    PermanentError,
    DataError,
    RecursionError,
    UnicodeError,
)


def classify(exc: BaseException) -> str:
    """Permanent when the error will recur on every attempt (ALWAYS_RECUR); anything
    else may succeed later: a lost connection, a deadlock, a lock or statement timeout,
    a read-only or restarting database, a row that another event has yet to create
    (IntegrityError), a dependency that is down, a bug that a deploy may fix."""
    return PERMANENT if isinstance(exc, ALWAYS_RECUR) else TRANSIENT


def retry_delay(attempts: int, *, rng: random.Random | None = None) -> timedelta:
    """The wait before the next retry: full jitter between RETRY_BASE_DELAY_SECONDS and
    RETRY_MAX_DELAY_SECONDS (core/backoff.py)."""
    config = app_settings()
    wait = full_jitter(attempts, base=config.retry_base_delay, cap=config.retry_max_delay, rng=rng)
    return timedelta(seconds=wait)


@dataclass(frozen=True)
class CapturedEvent:
    """What a failed delivery leaves for later: the verified bytes and their context."""

    source: str
    event_key: str
    event_type: str
    message_id: str
    signature_timestamp: int | None
    body: bytes
    headers: dict[str, str]


def failure_capture(
    *, captured: CapturedEvent, exc: BaseException, now: datetime | None = None
) -> FailedEvent:
    """Record a failed delivery in its own transaction; return the failed-event row.

    A key already held as failed (the sender redelivered it, and it failed again)
    gets the new error appended to the same row. Bounded like the claim: if the failed
    events are locked too, an error (a 503) within the bound beats holding the sender.
    """
    now = now or timezone.now()
    with transaction.atomic():
        _bound()
        failed, _ = FailedEvent.objects.select_for_update().get_or_create(
            source=captured.source,
            event_key=captured.event_key,
            defaults={
                "event_type": storable.text(captured.event_type, 255),
                "message_id": storable.text(captured.message_id, 255),
                "signature_timestamp": storable.moment(captured.signature_timestamp),
                "body": captured.body,
                "headers": captured.headers,
                "status": FailureStatus.RETRYING,
                "first_attempt_at": now,
                "last_attempt_at": now,
            },
        )
        if failed.status == FailureStatus.RESOLVED:
            # a new delivery failed, so no receipt holds this key any more: retry it
            failed.status = FailureStatus.RETRYING
        _record_failure(failed, exc, trigger="delivery", now=now)
    return failed


def _record_failure(
    failed: FailedEvent, exc: BaseException, *, trigger: str, now: datetime
) -> None:
    """Append the error and decide what comes next. The caller holds the row lock."""
    kind = classify(exc)
    error_class = logs.error_name(exc)
    was = failed.status
    failed.attempts += 1
    entry = {
        "attempt": failed.attempts,
        "at": now.isoformat(),
        "trigger": trigger,
        "kind": kind,
        "exception": error_class,
        "message": str(exc)[:MAX_MESSAGE_CHARS],
        "traceback": "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:],
    }
    if isinstance(exc, InvalidPayload) and exc.fields:
        # per field, as the handler's serializer worded them: the pages list them
        # (bounded: a hostile body can fail on every one of its fields, with its own
        # bytes quoted in a message)
        entry["fields"] = {
            path[:200]: [text[:300] for text in found[:5]]
            for path, found in list(exc.fields.items())[:50]
        }
    failed.errors = [*failed.errors, entry]
    failed.last_error_class = error_class[:255]
    failed.last_error_message = str(exc)[:MAX_MESSAGE_CHARS]
    failed.last_attempt_at = now
    if failed.status == FailureStatus.RETRYING:
        if kind == PERMANENT or failed.attempts >= app_settings().retry_max_attempts:
            failed.status = FailureStatus.DEAD
            failed.next_attempt_at = None
        else:
            failed.next_attempt_at = now + retry_delay(failed.attempts)
    # dead, discarded and resolved events keep their status: a failed replay adds its
    # error to the history, and only an operator's action moves them
    failed.save()
    line = _failure_line(failed, exc, trigger=trigger, now=now, was=was)
    # said once it is so: the caller's transaction may still roll back
    transaction.on_commit(line, robust=True)


def _failure_line(
    failed: FailedEvent, exc: BaseException, *, trigger: str, now: datetime, was: str
) -> Callable[[], None]:
    """The failed attempt's log line: the event, the attempt, the error, and what
    happens next (a retry and when, or a person's decision)."""
    if failed.status == FailureStatus.RETRYING and failed.next_attempt_at is not None:
        wait = max(0, round((failed.next_attempt_at - now).total_seconds()))
        what, level = "webhook event deferred", logging.WARNING
        then = f"retry at {failed.next_attempt_at.isoformat()} (in {wait} s)"
    elif failed.status == FailureStatus.DEAD and was != FailureStatus.DEAD:
        what, level = "webhook event dead-lettered", logging.ERROR
        then = "none: a person replays or discards it (admin, or replay_dead_letters)"
    else:  # a dead, discarded or resolved event failed again: it stays as it was
        what, level = "webhook event failed again", logging.WARNING
        then = f"none: it stays {failed.status}"
    fields = {
        "source": failed.source,
        "event_key": failed.event_key,
        "event_type": failed.event_type,
        "trigger": trigger,
        "attempt": f"{failed.attempts}/{app_settings().retry_max_attempts}",
        "error": logs.error_name(exc),
        "message": str(exc).splitlines()[0] if str(exc) else "",
        "next": then,
    }
    return functools.partial(logs.log_line, logger, level, what, **fields)


def _lock_order(failed: FailedEvent) -> tuple[str, datetime, int]:
    """A failed event's place in a batch: by the subject its data names (the rows its
    effect locks), then as it was due."""
    try:
        payload = json.loads(bytes(failed.body))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser: none
        payload = None
    subject = subject_of(payload.get("data")) if isinstance(payload, dict) else ""
    return subject, failed.next_attempt_at or failed.first_attempt_at, failed.pk


def _stored_event(failed: FailedEvent) -> WebhookEvent:
    """Parse the stored, already verified bytes again (no signature check)."""
    source = source_lookup(failed.source)
    if source is None:
        raise PermanentError(f"Source {failed.source!r} is no longer configured.")
    timestamp = failed.signature_timestamp
    message = VerifiedMessage(
        scheme=source.scheme,
        message_id=failed.message_id or None,
        timestamp=int(timestamp.timestamp()) if timestamp else None,
        body_sha256=hashlib.sha256(failed.body).hexdigest(),
    )
    event = parse_event(source, message, CaseInsensitiveMapping(failed.headers), bytes(failed.body))
    if not failed.event_type:
        # The delivery failed before its event was parsed, so it is held under a stand-in
        # key; the key derived now is the one its sender's redeliveries will carry.
        return event
    return dataclasses.replace(event, event_key=failed.event_key)  # the original key


def _apply_stored(failed: FailedEvent, *, trigger: str, now: datetime) -> Result:
    """Run the stored event through the claim again; return its result, or FAILED.

    The caller holds the row lock, inside a transaction; a failure rolls back only the
    savepoint of the claim, and is recorded on the row. A success is said in the log
    once it commits; marking the row resolved is the caller's (one UPDATE per batch).
    """
    try:
        event = _stored_event(failed)
        with transaction.atomic():
            outcome = event_claim_and_apply(
                event=event,
                body=bytes(failed.body),
                headers=failed.headers,
                received_at=failed.first_attempt_at,  # the sender's delivery, not now
                resolve_failures=False,  # this row is resolved by the caller, under our lock
            )
    except Exception as exc:
        _record_failure(failed, exc, trigger=trigger, now=now)
        return Result.FAILED
    fields = {
        "source": failed.source,
        "event_key": failed.event_key,
        "event_type": failed.event_type,
        "trigger": trigger,
        "attempt": failed.attempts + 1,
        "result": outcome.status,
    }
    line = functools.partial(
        logs.log_line, logger, logging.INFO, "webhook event resolved", **fields
    )
    transaction.on_commit(line, robust=True)
    return outcome.status


def _attempt(failed: FailedEvent, *, trigger: str, now: datetime) -> Result:
    """One event's attempt with its row saved: a replay's. The caller holds the lock."""
    result = _apply_stored(failed, trigger=trigger, now=now)
    if result == Result.FAILED:
        return result  # recorded and saved by _record_failure
    if failed.status != FailureStatus.RESOLVED:  # a resolved record keeps how it ended
        failed.status = FailureStatus.RESOLVED
        failed.resolution = result
        failed.resolved_at = now
        failed.next_attempt_at = None
    failed.save()
    return result


def _bound() -> None:
    """A capture's, a retry's or a replay's transaction waits no longer than a
    delivery's: a locked table fails it (a retry stays due) instead of holding the
    sender, the worker or the page."""
    bounds.transaction_bound()


# A sweep's transaction stops taking on events after this long, so that the receipts it
# has claimed (which a concurrent redelivery of the same key waits for) are held for well
# under a delivery's LOCK_TIMEOUT_MS, however slow the handlers.
SWEEP_TRANSACTION_SECONDS = 0.5


def retry_failed_events(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Retry the events whose ``next_attempt_at`` has come; return how many were tried.

    A batch of due rows (SWEEP_BATCH_SIZE) is locked with ``SKIP LOCKED`` (several
    sweepers share a backlog, batch by batch, without ever running the same event at
    once) and retried in one transaction: each event's claim and effect in a savepoint of
    its own, then one UPDATE per result marks the batch resolved. A worker killed
    mid-batch rolls it all back: its rows, still due, are released for the next sweep,
    and no effect of theirs committed.
    """
    batch = app_settings().sweep_batch_size
    limit = limit or batch
    tried = 0
    while tried < limit:
        moment = now or timezone.now()
        with transaction.atomic():
            _bound()
            # errors (tracebacks, up to RETRY_MAX_ATTEMPTS of them) are read only for
            # an event that fails again
            due = list(
                FailedEvent.objects.select_for_update(skip_locked=True)
                .filter(status=FailureStatus.RETRYING, next_attempt_at__lte=moment)
                .order_by("next_attempt_at", "id")
                .defer("errors")[: min(limit - tried, batch)]
            )
            if not due:
                break
            # Applied in the order of their subjects: each event's effect locks its
            # subject's rows (an order's) until the batch commits, and two sweeps that
            # took the same orders in opposite orders deadlocked; in one order, the
            # second waits for the first instead.
            due.sort(key=_lock_order)
            started = time.monotonic()
            resolved: dict[str, list[int]] = {}
            for failed in due:
                result = _apply_stored(failed, trigger="retry", now=moment)
                tried += 1
                if result != Result.FAILED:
                    resolved.setdefault(result, []).append(failed.pk)
                if time.monotonic() - started > SWEEP_TRANSACTION_SECONDS:
                    break  # the rest stay due, released at commit
            for resolution, ids in resolved.items():
                failed_events_mark_resolved(ids, resolution=resolution, at=moment)
    return tried


@dataclass(frozen=True)
class ReplayResult:
    failed_id: int
    source: str
    event_key: str
    result: Result
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.result not in (Result.FAILED, Result.SKIPPED)


def failed_event_replay(*, failed_id: int, actor: str, now: datetime | None = None) -> ReplayResult:
    """Replay one failed event now, on an operator's request, under its original key.

    Any status may be replayed: the claim decides. A key already applied (a resolved
    record, or one the sender redelivered meanwhile) answers duplicate, applying nothing.
    """
    now = now or timezone.now()
    with transaction.atomic():
        _bound()
        failed = (
            FailedEvent.objects.select_for_update(skip_locked=True).filter(pk=failed_id).first()
        )
        if failed is None:
            return ReplayResult(
                failed_id, "", "", Result.SKIPPED, "missing, or being processed now"
            )
        failed.last_replayed_by = actor[:150]
        failed.last_replayed_at = now
        result = _attempt(failed, trigger=f"replay by {actor}", now=now)
    detail = failed.last_error_message if result == Result.FAILED else ""
    return ReplayResult(failed.pk, failed.source, failed.event_key, result, detail)


def failed_event_discard(
    *, failed_id: int, actor: str, reason: str, now: datetime | None = None
) -> bool:
    """Give up on one failed event, with a reason on record. Returns whether it changed."""
    if not reason.strip():
        raise ValueError("Discarding a failed event needs a reason.")
    with transaction.atomic():
        failed = FailedEvent.objects.select_for_update().filter(pk=failed_id).first()
        if failed is None or failed.status in (FailureStatus.RESOLVED, FailureStatus.DISCARDED):
            return False
        failed.status = FailureStatus.DISCARDED
        failed.next_attempt_at = None
        failed.discarded_by = actor[:150]
        failed.discarded_at = now or timezone.now()
        failed.discard_reason = reason.strip()
        failed.save()
    return True


def purge_failed_events(*, now: datetime | None = None) -> int:
    """Delete resolved and discarded events past their retention; never dead ones."""
    config = app_settings()
    cutoff = (now or timezone.now()) - config.failed_event_retention
    return delete_in_batches(
        FailedEvent.objects.filter(
            status__in=(FailureStatus.RESOLVED, FailureStatus.DISCARDED), updated_at__lt=cutoff
        ),
        batch_size=config.purge_batch_size,
    )


def failed_event_summary(failed: FailedEvent) -> dict[str, Any]:
    """The operator's one-line view of a failed event (used by the replay command)."""
    return {
        "id": failed.pk,
        "source": failed.source,
        "event_key": failed.event_key,
        "event_type": failed.event_type,
        "status": failed.status,
        "attempts": failed.attempts,
        "last_error": failed.last_error_class.rsplit(".", 1)[-1],
    }
