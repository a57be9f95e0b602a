"""The relay: claim a destination's eligible messages, send them with no transaction
open, record what each answer means.

One round for one destination:

1. ``relay_claim``: lock the destination's row and count its unexpired leases (the
   requests in flight on every worker), refill its token bucket, and claim as many
   eligible messages as both limits allow, oldest first, with ``FOR UPDATE SKIP
   LOCKED`` on PostgreSQL. A message whose ordering key has an older open message
   waits for it. Each claimed message gets a lease: a worker that dies holds it only
   until the lease ends, and the message is then claimed again, under the same key.
2. ``relay_send``: the HTTP requests, concurrently up to the claim's size, on a client
   kept per destination (connection reuse). No transaction is open.
3. ``relay_record``: delivered, deferred (Retry-After, or backoff with full jitter) or
   terminal, one attempt row each, and the breaker.

``relay_destination`` records a round and claims the next in one short transaction:
seven statements for up to ten deliveries (see the SQL below), bounded by the lock and
statement timeouts. Called alone, each of the two runs in a transaction of its own.

Every answer is recordable, whatever the destination sent: the request ends at the
destination's timeout from connect to the last byte kept (``core/peer_http.py``),
and what is stored of it is made fit for its column (``core/storable.py``). A round
that still cannot be recorded whole is recorded answer by answer; an attempt that was
never recorded (a worker killed, a database that refused) is counted against the
message's budget when its lease runs out, so nothing is sent past its budget.

No worker ever sleeps: a deferral is the message's ``next_attempt_at``; a destination
out of tokens is relayed again when its next token is due (``RelayRound.wait``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db import DatabaseError, OperationalError, connection, transaction
from django.utils import timezone

from ...conf import app_settings
from ...core import faults, storable
from ...core.peer_http import body_start, charset_of, parse_retry_after, text_of
from ...core.peer_http import client as peer_client
from ...core.peer_http import deadline as request_deadline
from ...schemes.standard import StandardWebhooks
from ...watch.sources import duration_text
from .. import metrics
from ..models import MessageStatus, OutboxMessage, WebhookDestination
from ..notices import terminal_notice

logger = logging.getLogger(__name__)

# a lease outlives the request's own timeout by this much
LEASE_MARGIN = timedelta(seconds=30)
# answers that no retry will change: for an operator
TERMINAL_STATUSES = frozenset({400, 401, 403, 404, 410, 422})
# answers that may carry Retry-After: the destination pacing us
PACING_STATUSES = frozenset({429, 503})
EXCERPT_CHARS = 500
# bytes of an answer's body read for its excerpt
EXCERPT_BYTES = EXCERPT_CHARS * 4
CLAIM_BATCH = 10
# the last error of a message whose unrecorded attempt spent its budget
UNRECORDED = (
    "its last attempt was never recorded (the worker stopped, or the database refused "
    "its answer), and that spent its retry budget"
)

# The relay's statements, written out: a round is a handful of them, each read here
# whole. Datetimes go through connection.ops (SQLite keeps them as text). RETURNING
# needs SQLite 3.35 or newer (system check webhook_receiver.E007).

# The destination's row, locked (the limiter's state lives on it: one claimer at a
# time), with its requests in flight on every worker: its unexpired leases.
_LOCKED_DESTINATION = """
    SELECT d.*, (
        SELECT count(*) FROM webhook_receiver_outboxmessage m
        WHERE m.destination_id = d.id AND m.status = 'sending' AND m.lease_until > %(now)s
    ) AS in_flight
    FROM webhook_receiver_webhookdestination d
    WHERE d.id = %(destination_id)s
"""
# keyed by (vendor, skip_if_busy); SQLite serialises writers: its IMMEDIATE transactions
# do the locking's job
LOCKED_DESTINATION = {
    ("postgresql", False): _LOCKED_DESTINATION + " FOR UPDATE OF d",
    ("postgresql", True): _LOCKED_DESTINATION + " FOR UPDATE OF d SKIP LOCKED",
}

# Eligible messages of one destination, oldest first: pending and due, or claimed by a
# worker whose lease has run out (the partial index webhook_outbox_open holds just the
# open ones, so delivered history costs nothing). A message waits while an older one
# with its ordering key is still open (pending, sending, or failed until an operator
# acts).
_ELIGIBLE = """
    SELECT m.id FROM webhook_receiver_outboxmessage m
    WHERE m.destination_id = %(destination_id)s
      AND m.status IN ('pending', 'sending')
      AND ((m.status = 'pending' AND m.next_attempt_at <= %(now)s)
           OR (m.status = 'sending' AND m.lease_until <= %(now)s))
      AND (m.ordering_key = '' OR NOT EXISTS (
            SELECT 1 FROM webhook_receiver_outboxmessage o
            WHERE o.destination_id = m.destination_id AND o.ordering_key = m.ordering_key
              AND o.id < m.id AND o.status IN ('pending', 'sending', 'failed')))
    ORDER BY m.id
    LIMIT %(limit)s
"""
# PostgreSQL: rows another worker is claiming are skipped, not waited for
ELIGIBLE = {"postgresql": _ELIGIBLE + " FOR UPDATE OF m SKIP LOCKED"}

# The claim: the eligible rows (selected once: MATERIALIZED) take a lease and count an
# attempt, and come back to be sent. One still 'sending' had a lease that ran out: its
# attempt was never recorded (its worker stopped, or the database refused the round), and
# it spends the retry budget as a failure does. When that spends the last of it, the
# message is failed here instead of sent again (SPENT; every SET sees the row as it was).
_SPENT = "(status = 'sending' AND failures + 1 >= %(max_attempts)s)"
CLAIM = f"""
    WITH claimable AS MATERIALIZED ({{eligible}})
    UPDATE webhook_receiver_outboxmessage
    SET status = CASE WHEN {_SPENT} THEN 'failed' ELSE 'sending' END,
        lease_until = CASE WHEN {_SPENT} THEN NULL ELSE %(lease_until)s END,
        attempts = attempts + CASE WHEN {_SPENT} THEN 0 ELSE 1 END,
        next_attempt_at = CASE WHEN {_SPENT} THEN %(now)s ELSE next_attempt_at END,
        last_error = CASE WHEN {_SPENT} THEN %(unrecorded)s ELSE last_error END,
        failures = failures + CASE WHEN status = 'sending' THEN 1 ELSE 0 END
    WHERE id IN (SELECT id FROM claimable)
    RETURNING id, key, event_type, payload, attempts, failures, created_at, status
"""

TOKENS_SPENT = """
    UPDATE webhook_receiver_webhookdestination SET tokens = %s, tokens_at = %s
    WHERE id = %s
"""

# A round's answers, one UPDATE per distinct outcome (one a round when every answer is
# a 2xx). Only on messages this claim still holds (sending, at this attempt): a worker
# whose lease ran out (frozen, or held by a slow answer) must not undo the claim that
# took over. The ones it changed come back.
RECORD = """
    UPDATE webhook_receiver_outboxmessage
    SET status = %s, failures = %s, next_attempt_at = %s, lease_until = NULL,
        delivered_at = %s, last_status_code = %s, last_error = %s
    WHERE id IN ({ids}) AND status = 'sending' AND attempts = %s
    RETURNING id
"""

# Every attempt of a round, in one statement.
ATTEMPTS = """
    INSERT INTO webhook_receiver_deliveryattempt (message_id, number, started_at,
        duration_ms, status_code, error, response_excerpt, next_attempt_at)
    VALUES {rows}
"""

BREAKER_CLOSED = """
    UPDATE webhook_receiver_webhookdestination
    SET consecutive_failures = 0, paused_until = NULL, last_success_at = %s
    WHERE id = %s
"""

# A round that could not be recorded, for the overview and webhook_status (in a
# transaction of its own, after the round's rolled back).
RECORD_FAILED = """
    UPDATE webhook_receiver_webhookdestination SET record_error = %s, record_failed_at = %s
    WHERE id = %s
"""


@dataclass(frozen=True)
class Claimed:
    id: int
    key: str
    event_type: str
    payload: Any
    attempt: int
    failures: int
    created_at: datetime


@dataclass(frozen=True)
class Sent:
    message: Claimed
    started_at: datetime
    duration_ms: int
    status_code: int | None = None
    error: str = ""
    excerpt: str = ""
    retry_after: str | None = None


@dataclass(frozen=True)
class RelayRound:
    claimed: list[Claimed]
    # seconds until this destination may start another request (out of tokens), or None
    wait: float | None = None
    # another worker was claiming for this destination at that moment
    busy: bool = False


@contextmanager
def bounded(*, savepoint: bool = False) -> Iterator[None]:
    """A transaction of the relay's, its statements bounded on PostgreSQL: none waits
    longer than LOCK_TIMEOUT_MS for a lock or runs longer than STATEMENT_TIMEOUT_MS, so
    that a locked outbox (a migration, VACUUM FULL) ends a round within seconds, to be
    run again by the next sweep. The bounds are local to the transaction (nothing stays
    on the session, as PgBouncer's transaction mode requires). Inside a caller's
    transaction it joins it (in a savepoint of its own with ``savepoint``) and leaves the
    bounds to the caller."""
    outermost = not connection.in_atomic_block
    with transaction.atomic(savepoint=savepoint):
        if outermost:
            config = app_settings()
            faults.transaction_bound(
                lock_timeout_ms=config.lock_timeout_ms,
                statement_timeout_ms=config.statement_timeout_ms,
            )
        yield


def bound_fired(exc: BaseException) -> bool:
    """``exc`` is a lock or statement timeout of the relay's own bounds."""
    return faults.sqlstate(exc) in faults.TIMEOUT_STATES


# --- 1. claim ------------------------------------------------------------------------


def relay_claim(
    *,
    destination: WebhookDestination | int,
    now: datetime | None = None,
    limit: int = CLAIM_BATCH,
    skip_if_busy: bool = False,
) -> RelayRound:
    """Claim what the destination's limits allow now (see the module's docstring).

    With ``skip_if_busy``, a destination whose row another worker holds is left to that
    worker (``busy``): a burst of triggers then costs a statement each, not a queue of
    runs waiting for one lock."""
    now = now or timezone.now()
    destination_id = destination if isinstance(destination, int) else destination.pk
    adapt = connection.ops.adapt_datetimefield_value
    params = {"destination_id": destination_id, "now": adapt(now)}
    # no savepoint: relay_destination runs this in the transaction that records the
    # last round
    with bounded():
        locked = LOCKED_DESTINATION.get((connection.vendor, skip_if_busy), _LOCKED_DESTINATION)
        dest = next(iter(WebhookDestination.objects.raw(locked, params)), None)
        if dest is None:
            if not WebhookDestination.objects.filter(pk=destination_id).exists():
                raise WebhookDestination.DoesNotExist(f"no destination {destination_id}")
            return RelayRound(claimed=[], busy=True)
        if not dest.enabled or (dest.paused_until and dest.paused_until > now):
            return RelayRound(claimed=[])
        slots = dest.max_in_flight - dest.in_flight
        if dest.consecutive_failures >= dest.breaker_threshold:
            # half-open after the cool-down: one probe decides
            slots = min(slots, 1 if dest.in_flight == 0 else 0)
        tokens = _refilled(dest, now)
        allowed = min(limit, slots, math.floor(tokens))
        claimed: list[Claimed] = []
        spent: list[Claimed] = []
        if allowed > 0:
            lease_until = now + timedelta(seconds=dest.timeout_seconds) + LEASE_MARGIN
            claimed, spent = _claim_rows(
                {
                    **params,
                    "limit": allowed,
                    "lease_until": adapt(lease_until),
                    "max_attempts": dest.max_attempts,
                    "unrecorded": UNRECORDED,
                }
            )
        if spent:
            _spent_by_the_claim(dest, spent)
        tokens -= len(claimed)
        # never back in time: `now` may predate the last writer's (read before this lock
        # was waited for, or on a host whose clock is behind), and a span refills once
        tokens_at = max(now, dest.tokens_at or now)
        with connection.cursor() as cursor:
            cursor.execute(TOKENS_SPENT, [tokens, adapt(tokens_at), dest.pk])
    wait = None
    if len(claimed) < limit and slots > len(claimed) and tokens < 1:
        wait = (1 - tokens) * dest.rate_seconds / dest.rate_count
    return RelayRound(claimed=claimed, wait=wait)


def _spent_by_the_claim(dest: WebhookDestination, spent: list[Claimed]) -> None:
    """Messages the claim failed (their unrecorded attempt spent the budget): the notice,
    then, once committed, the log line and the count, as for any terminal answer."""
    for message in spent:
        _terminal_notice(dest, message, answer="attempt not recorded")

    def committed() -> None:
        for message in spent:
            then = f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
            _answer_log(dest, message, "gave no recorded answer", then)
            metrics.terminal_count(dest.name)

    transaction.on_commit(committed)


def _refilled(dest: WebhookDestination, now: datetime) -> float:
    """The token bucket at ``now``: refilled at rate_count per rate_seconds since it was
    last written, holding at most ``burst`` (at least one) tokens. A new bucket is full."""
    capacity = max(1, dest.burst)
    if dest.tokens_at is None:
        return float(capacity)
    elapsed = max(0.0, (now - dest.tokens_at).total_seconds())
    return min(capacity, dest.tokens + elapsed * dest.rate_count / dest.rate_seconds)


def _claim_rows(params: dict[str, Any]) -> tuple[list[Claimed], list[Claimed]]:
    """The claim's one statement (each claim is an attempt, counted now: its number
    fences the claim's result): the messages to send, and those it failed instead.
    Read through the ORM's raw(): typed as the model's fields are, on either database."""
    claim = CLAIM.format(eligible=ELIGIBLE.get(connection.vendor, _ELIGIBLE))
    rows = OutboxMessage.objects.raw(claim, params)
    claimed: list[Claimed] = []
    spent: list[Claimed] = []
    for m in rows:
        message = Claimed(
            id=m.id,
            key=m.key,
            event_type=m.event_type,
            payload=m.payload,
            attempt=m.attempts,
            failures=m.failures,
            created_at=m.created_at,
        )
        (spent if m.status == MessageStatus.FAILED else claimed).append(message)
    # RETURNING keeps no order: sent (and recorded) oldest first
    return sorted(claimed, key=lambda c: c.id), spent


# --- 2. send -------------------------------------------------------------------------

_clients: dict[tuple[int, str, float], httpx.Client] = {}
_clients_lock = threading.Lock()


def _client(dest: WebhookDestination) -> httpx.Client:
    """One client per destination and process: its connections are reused."""
    ident = (dest.pk, dest.url, dest.timeout_seconds)
    with _clients_lock:
        client = _clients.get(ident)
        if client is None:
            limits = httpx.Limits(max_connections=max(1, dest.max_in_flight))
            client = peer_client(timeout=dest.timeout_seconds, limits=limits)
            _clients[ident] = client
        return client


def signed_request(
    dest: WebhookDestination, message: Claimed, timestamp: int
) -> tuple[bytes, dict]:
    """The body and headers of one attempt: the stable key as ``webhook-id`` and
    ``Idempotency-Key``, and a Standard Webhooks signature by each of the destination's
    secrets (space-separated, so a rotation verifies with either)."""
    body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()
    scheme = StandardWebhooks()
    signatures = [
        scheme.sign(secret=secret, body=body, message_id=message.key, timestamp=timestamp)
        for secret in dest.secrets
    ]
    headers = {
        "content-type": "application/json",
        # the excerpt is the answer's first bytes as sent: nothing to inflate
        "accept-encoding": "identity",
        "user-agent": "webhook-receiver-relay",
        "idempotency-key": message.key,
        "webhook-id": message.key,
        "webhook-timestamp": str(timestamp),
    }
    if signatures:
        headers["webhook-signature"] = " ".join(s["webhook-signature"] for s in signatures)
    return body, headers


_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    """One pool of sending threads per process, made on first use (after a Celery
    worker has forked, so that no thread crosses a fork)."""
    global _pool
    with _clients_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=CLAIM_BATCH, thread_name_prefix="relay-send")
        return _pool


def relay_send(dest: WebhookDestination, claimed: list[Claimed]) -> list[Sent]:
    """Send each claimed message once, concurrently; never raises for a message."""
    if not claimed:
        return []
    if len(claimed) == 1:
        return [_send_one(dest, claimed[0])]
    return list(_executor().map(lambda m: _send_one(dest, m), claimed))


def _send_one(dest: WebhookDestination, message: Claimed) -> Sent:
    """One request, over by the destination's timeout from connect to the last byte of
    the excerpt, whatever the destination does (a status line, headers or a body that
    trickle): its lease, timeout + LEASE_MARGIN, always outlives it. What is kept of the
    answer is made storable here."""
    # the start is the claim's (its token spent): before a first request builds the client
    started_at = timezone.now()
    began = time.monotonic()
    body, headers = signed_request(dest, message, int(time.time()))
    try:
        client = _client(dest)
        with (
            request_deadline(dest.timeout_seconds),
            client.stream("POST", dest.url, content=body, headers=headers) as response,
        ):
            # the status line decides the verdict; the body is only for an operator
            data = body_start(response, max_bytes=EXCERPT_BYTES)
            status_code = response.status_code
            retry_after = response.headers.get("retry-after")
            charset = charset_of(response)
    except Exception as exc:  # no answer: refused, reset, timed out, or a URL httpx refuses
        return Sent(
            message=message,
            started_at=started_at,
            duration_ms=_ms_since(began),
            error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS),
        )
    return Sent(
        message=message,
        started_at=started_at,
        duration_ms=_ms_since(began),
        status_code=status_code,
        excerpt=storable.text(text_of(data, charset), EXCERPT_CHARS),
        retry_after=retry_after,
    )


def _ms_since(began: float) -> int:
    return round((time.monotonic() - began) * 1000)


# --- 3. record -----------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    status: str  # a MessageStatus
    next_attempt_at: datetime | None
    spends_budget: bool
    breaker_failure: bool


def retry_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Exponential backoff with full jitter: a random wait in [0, min(cap, base * 2^(n-1))]."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0.0, ceiling)


def verdict(dest: WebhookDestination, sent: Sent, now: datetime) -> Verdict:
    """What one answer means for its message (the issue's table, in one place)."""
    code = sent.status_code
    if code is not None and 200 <= code < 300:
        return Verdict(MessageStatus.DELIVERED, None, spends_budget=False, breaker_failure=False)
    if code in TERMINAL_STATUSES:
        return Verdict(MessageStatus.FAILED, None, spends_budget=True, breaker_failure=False)
    if code in PACING_STATUSES:
        wait = parse_retry_after(sent.retry_after, now=now, cap=dest.retry_after_cap_seconds)
        if wait is not None:
            # the destination is pacing us: later, without spending the retry budget
            at = now + timedelta(seconds=wait)
            return Verdict(
                MessageStatus.PENDING, at, spends_budget=False, breaker_failure=code == 503
            )
    # other answers, timeouts and connection errors: backoff, same key
    if sent.message.failures + 1 >= dest.max_attempts:
        return Verdict(MessageStatus.FAILED, None, spends_budget=True, breaker_failure=True)
    wait = retry_delay(
        sent.message.failures + 1, base=dest.backoff_base_seconds, cap=dest.backoff_cap_seconds
    )
    return Verdict(
        MessageStatus.PENDING,
        now + timedelta(seconds=wait),
        spends_budget=True,
        breaker_failure=True,
    )


def relay_record(
    dest: WebhookDestination, results: list[Sent], *, now: datetime | None = None
) -> None:
    """Record every answer of a round: the messages this claim still holds, one attempt
    row each, and the destination's breaker. In its own transaction, or in the caller's
    (relay_destination records a round in the transaction that claims the next)."""
    if not results:
        return
    now = now or timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    verdicts = [verdict(dest, sent, now) for sent in results]
    # (the new values, then the attempt that fences them) -> the messages they go to
    outcomes: dict[tuple[Any, ...], list[int]] = {}
    for sent, v in zip(results, verdicts, strict=True):
        m = sent.message
        delivered = v.status == MessageStatus.DELIVERED
        outcome = (
            v.status,
            m.failures + (1 if v.spends_budget else 0),
            adapt(v.next_attempt_at or now),
            adapt(now if delivered else None),
            sent.status_code,
            sent.error or ("" if delivered else sent.excerpt),
            m.attempt,
        )
        outcomes.setdefault(outcome, []).append(m.id)
    attempt_rows = [
        (
            sent.message.id,
            sent.message.attempt,
            adapt(sent.started_at),
            sent.duration_ms,
            sent.status_code,
            sent.error,
            sent.excerpt,
            adapt(v.next_attempt_at),
        )
        for sent, v in zip(results, verdicts, strict=True)
    ]
    recorded: set[int] = set()
    with bounded(), connection.cursor() as cursor:
        for (*values, attempt), ids in outcomes.items():
            cursor.execute(RECORD.format(ids=_placeholders(len(ids))), [*values, *ids, attempt])
            recorded.update(row[0] for row in cursor.fetchall())
        rows = ", ".join([f"({_placeholders(len(attempt_rows[0]))})"] * len(attempt_rows))
        cursor.execute(ATTEMPTS.format(rows=rows), [x for row in attempt_rows for x in row])
        _breaker_record(
            dest,
            successes=sum(v.status == MessageStatus.DELIVERED for v in verdicts),
            failures=sum(v.breaker_failure for v in verdicts),
            now=now,
        )
        for sent, v in zip(results, verdicts, strict=True):
            if v.status == MessageStatus.FAILED and sent.message.id in recorded:
                # in the round's transaction: no notice for an answer not recorded
                answer = sent.error if sent.status_code is None else str(sent.status_code)
                _terminal_notice(dest, sent.message, answer=answer)
        # counted and logged once the answers are durable: a round that rolls back is
        # sent again
        transaction.on_commit(
            lambda: _recorded(dest, list(zip(results, verdicts, strict=True)), recorded, now)
        )


def _recorded(
    dest: WebhookDestination,
    answers: list[tuple[Sent, Verdict]],
    recorded: set[int],
    now: datetime,
) -> None:
    """After the round's commit: its counters, and one log line per answer that was not
    a 2xx (delivered ones are counted, not logged one by one)."""
    for sent, v in answers:
        message = sent.message
        if message.id not in recorded:
            _answer_log(dest, message, _answer_words(sent), "not recorded: its lease ran out")
            continue
        if v.status == MessageStatus.DELIVERED:
            metrics.delivery_record(
                dest.name,
                created_at=message.created_at,
                delivered_at=now,
                attempts=message.attempt,
            )
            continue
        if v.status == MessageStatus.FAILED:
            metrics.terminal_count(dest.name)
        _answer_log(dest, message, _answer_words(sent), _what_next(dest, sent, v, now))


def _answer_words(sent: Sent) -> str:
    if sent.status_code is None:
        return f"gave no answer ({sent.error})"
    return f"answered {sent.status_code}"


def _what_next(dest: WebhookDestination, sent: Sent, v: Verdict, now: datetime) -> str:
    if v.status == MessageStatus.FAILED:
        if sent.status_code in TERMINAL_STATUSES:
            return "failed for good (a terminal answer), waiting for an operator"
        return f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
    wait = duration_text((v.next_attempt_at or now) - now)
    if not v.spends_budget:
        return f"deferred {wait} as Retry-After asks"
    return f"retried in {wait} (failure {sent.message.failures + 1} of {dest.max_attempts})"


def _answer_log(dest: WebhookDestination, message: Claimed, answer: str, then: str) -> None:
    """One WARNING line per answer that was not a 2xx, or request that got none."""
    answer = storable.text(answer, 300)
    logger.warning(
        "outbox: %s %s to %s, attempt %d: %s",
        dest.name,
        answer,
        storable.text(message.key, 255),
        message.attempt,
        then,
        extra={
            "webhook": {
                "destination": dest.name,
                "key": message.key,
                "attempt": message.attempt,
                "answer": answer,
                "next": then,
            }
        },
    )


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _terminal_notice(dest: WebhookDestination, message: Claimed, *, answer: str) -> None:
    """Tell the ops destination (if any); a failure here never fails the round (a
    savepoint of its own when the round's transaction is open)."""
    try:
        with transaction.atomic():
            terminal_notice(
                destination=dest.name,
                message_id=message.id,
                key=message.key,
                event_type=message.event_type,
                answer=answer,
            )
    except Exception:
        logger.exception("terminal notice for %s not admitted", message.key)


def _breaker_record(
    dest: WebhookDestination, *, successes: int, failures: int, now: datetime
) -> None:
    """A success closes the breaker; consecutive failures past the threshold open it for
    the cool-down (after which relay_claim lets one probe through)."""
    if successes:
        with connection.cursor() as cursor:
            last_success = connection.ops.adapt_datetimefield_value(now)
            cursor.execute(BREAKER_CLOSED, [last_success, dest.pk])
    elif failures:
        row = WebhookDestination.objects.filter(pk=dest.pk)
        current = row.select_for_update().values_list("consecutive_failures", flat=True).get()
        count = current + failures
        paused = None
        if count >= dest.breaker_threshold:
            paused = now + timedelta(seconds=dest.breaker_cooldown_seconds)
            logger.warning(
                "destination %s paused for %ss after %d consecutive failures",
                dest.name,
                dest.breaker_cooldown_seconds,
                count,
            )
        row.update(consecutive_failures=count, paused_until=paused, last_failure_at=now)


# --- a whole run ---------------------------------------------------------------------


def relay_destination(
    *, destination_id: int, budget_seconds: float = 20.0
) -> tuple[int, float | None]:
    """Relay one destination until it has nothing eligible, its limits stop it, or the
    time budget is spent. Returns (messages sent, seconds until it may send again or
    None).

    A round's answers are recorded in the transaction that claims the next round: one
    transaction a round. If that transaction fails, the answers are recorded one by one,
    each in a transaction of its own (``_record_each``), unless the database itself is
    failing (a bound that fired, a lost connection): then the error is noted on the
    destination and raised, and the messages are sent again, under the same keys and
    with the lost attempt counted, when their leases end."""
    deadline = time.monotonic() + budget_seconds
    dest: WebhookDestination | None = None
    sent_count = 0
    results: list[Sent] = []
    while True:
        more = time.monotonic() < deadline
        try:
            # one transaction a round: the last round's answers, then the next claim
            with bounded(savepoint=True):
                if dest is None:
                    dest = WebhookDestination.objects.get(pk=destination_id)
                relay_record(dest, results)
                # a worker already claiming for this destination carries on; this run stops
                round_ = relay_claim(destination=dest, skip_if_busy=True) if more else None
        except (DatabaseError, ValueError, TypeError, ArithmeticError) as exc:
            if not results or dest is None:
                raise
            _record_failed(dest, exc)
            if isinstance(exc, OperationalError):
                raise  # the database is failing: one answer at a time would fail as well
            faults.log_failure(
                logger,
                "outbox: a round's answers could not be recorded together; recording them "
                "one by one",
                exc,
                destination=dest.name,
            )
            _record_each(dest, results)
            results = []
            continue
        if round_ is None:
            return sent_count, 0.0
        if not round_.claimed:
            return sent_count, round_.wait
        results = relay_send(dest, round_.claimed)
        sent_count += len(results)


def _record_each(dest: WebhookDestination, results: list[Sent]) -> None:
    """The answers of a round that could not be recorded together, each in a transaction
    of its own: one that still fails is recorded without what its answer held (the
    verdict stands), and one that cannot be recorded at all is left to its lease."""
    for sent in results:
        try:
            with bounded(savepoint=True):
                relay_record(dest, [sent])
            continue
        except Exception as exc:
            stripped = replace(
                sent,
                excerpt="",
                error=storable.text(f"answer not recordable: {_error_line(exc)}", EXCERPT_CHARS),
            )
        try:
            with bounded(savepoint=True):
                relay_record(dest, [stripped])
        except Exception as exc:
            faults.log_failure(
                logger,
                "outbox: an answer not recorded; its lease runs out and it is sent again",
                exc,
                destination=dest.name,
                key=sent.message.key,
                attempt=sent.message.attempt,
            )


def _record_failed(dest: WebhookDestination, exc: BaseException) -> None:
    """Note on the destination that a round could not be recorded (the overview and
    webhook_status say so); never raises."""
    error = storable.text(_error_line(exc), 500)
    try:
        with bounded(savepoint=True), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(RECORD_FAILED, [error, now, dest.pk])
    except Exception:
        logger.warning("outbox: %s: the failure to record could not be noted either", dest.name)


def _error_line(exc: BaseException) -> str:
    """The error's class and first line: PostgreSQL's DETAIL and CONTEXT lines may quote
    the values (the answer itself) that could not be stored."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
