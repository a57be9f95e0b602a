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
six statements for up to ten deliveries (see the SQL below). Called alone, each of the
two runs in a transaction of its own.

No worker ever sleeps: a deferral is the message's ``next_attempt_at``; a destination
out of tokens is relayed again when its next token is due (``RelayRound.wait``).
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db import connection, transaction
from django.utils import timezone

from ..signatures.standard import StandardWebhooks
from . import metrics
from .models import MessageStatus, OutboxMessage, WebhookDestination
from .notices import terminal_notice

logger = logging.getLogger(__name__)

# a lease outlives the request's own timeout by this much
LEASE_MARGIN = timedelta(seconds=30)
# answers that no retry will change: for an operator
TERMINAL_STATUSES = frozenset({400, 401, 403, 404, 410, 422})
# answers that may carry Retry-After: the destination pacing us
PACING_STATUSES = frozenset({429, 503})
EXCERPT_CHARS = 500
CLAIM_BATCH = 10

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
# attempt, and come back to be sent.
CLAIM = """
    WITH claimable AS MATERIALIZED ({eligible})
    UPDATE webhook_receiver_outboxmessage
    SET status = 'sending', lease_until = %(lease_until)s, attempts = attempts + 1
    WHERE id IN (SELECT id FROM claimable)
    RETURNING id, key, event_type, payload, attempts, failures, created_at
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
    with transaction.atomic(savepoint=False):
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
        if allowed > 0:
            lease_until = now + timedelta(seconds=dest.timeout_seconds) + LEASE_MARGIN
            claimed = _claim_rows({**params, "limit": allowed, "lease_until": adapt(lease_until)})
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


def _refilled(dest: WebhookDestination, now: datetime) -> float:
    """The token bucket at ``now``: refilled at rate_count per rate_seconds since it was
    last written, holding at most ``burst`` (at least one) tokens. A new bucket is full."""
    capacity = max(1, dest.burst)
    if dest.tokens_at is None:
        return float(capacity)
    elapsed = max(0.0, (now - dest.tokens_at).total_seconds())
    return min(capacity, dest.tokens + elapsed * dest.rate_count / dest.rate_seconds)


def _claim_rows(params: dict[str, Any]) -> list[Claimed]:
    """The claim's one statement (each claim is an attempt, counted now: its number
    fences the claim's result). Read through the ORM's raw(): typed as the model's
    fields are, on either database."""
    claim = CLAIM.format(eligible=ELIGIBLE.get(connection.vendor, _ELIGIBLE))
    rows = OutboxMessage.objects.raw(claim, params)
    claimed = [
        Claimed(
            id=m.id,
            key=m.key,
            event_type=m.event_type,
            payload=m.payload,
            attempt=m.attempts,
            failures=m.failures,
            created_at=m.created_at,
        )
        for m in rows
    ]
    # RETURNING keeps no order: sent (and recorded) oldest first
    return sorted(claimed, key=lambda c: c.id)


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
            client = httpx.Client(timeout=dest.timeout_seconds, limits=limits)
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
    started_at = timezone.now()
    began = time.monotonic()
    body, headers = signed_request(dest, message, int(time.time()))
    try:
        with _client(dest).stream("POST", dest.url, content=body, headers=headers) as response:
            excerpt = _excerpt(response, deadline=began + dest.timeout_seconds)
    except httpx.HTTPError as exc:
        return Sent(
            message=message,
            started_at=started_at,
            duration_ms=_ms_since(began),
            error=f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS],
        )
    return Sent(
        message=message,
        started_at=started_at,
        duration_ms=_ms_since(began),
        status_code=response.status_code,
        excerpt=excerpt,
        retry_after=response.headers.get("retry-after"),
    )


def _excerpt(response: httpx.Response, *, deadline: float) -> str:
    """The start of the answer's body, read until the request's timeout at most: httpx's
    timeout bounds each read, not the whole answer (encode/httpx#1450), and a body that
    trickles (or never ends) must not hold the request past its lease. The status line
    has arrived already: it decides the verdict; the body is only for an operator."""
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) >= EXCERPT_CHARS * 4 or time.monotonic() >= deadline:
            break
    return data.decode(response.encoding or "utf-8", errors="replace")[:EXCERPT_CHARS]


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


def parse_retry_after(value: str | None, *, now: datetime, cap: float) -> float | None:
    """Retry-After as seconds (``120``) or an HTTP date, capped; None when absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value[:9])
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - now).total_seconds()
    return min(max(0.0, seconds), cap)


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
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
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
        counted = []
        for sent, v in zip(results, verdicts, strict=True):
            if sent.message.id not in recorded:
                continue
            if v.status in (MessageStatus.DELIVERED, MessageStatus.FAILED):
                counted.append((sent.message, v.status))
            if v.status == MessageStatus.FAILED:
                # in the round's transaction: no notice for an answer not recorded
                _terminal_notice(dest, sent)
        # counted once the answers are durable: a round that rolls back is sent again
        transaction.on_commit(lambda: _outcomes_count(dest.name, counted, now))


def _outcomes_count(
    destination: str, counted: list[tuple[Claimed, str]], delivered_at: datetime
) -> None:
    for message, status in counted:
        if status == MessageStatus.DELIVERED:
            metrics.delivery_record(
                destination,
                created_at=message.created_at,
                delivered_at=delivered_at,
                attempts=message.attempt,
            )
        else:
            metrics.terminal_count(destination)


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _terminal_notice(dest: WebhookDestination, sent: Sent) -> None:
    """Tell the ops destination (if any); a failure here never fails the round (a
    savepoint of its own when the round's transaction is open)."""
    answer = str(sent.status_code) if sent.status_code is not None else sent.error
    try:
        with transaction.atomic():
            terminal_notice(
                destination=dest.name,
                message_id=sent.message.id,
                key=sent.message.key,
                event_type=sent.message.event_type,
                answer=answer,
            )
    except Exception:
        logger.exception("terminal notice for %s not admitted", sent.message.key)


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
    transaction a round. If that transaction fails, the answers are lost with it and
    the messages are sent again, under the same keys, when their leases end."""
    deadline = time.monotonic() + budget_seconds
    dest = WebhookDestination.objects.get(pk=destination_id)
    sent_count = 0
    results: list[Sent] = []
    while True:
        more = time.monotonic() < deadline
        # one transaction a round: the last round's answers, then the next claim
        with transaction.atomic():
            relay_record(dest, results)
            # a worker already claiming for this destination carries on; this run stops
            round_ = relay_claim(destination=dest, skip_if_busy=True) if more else None
        if round_ is None:
            return sent_count, 0.0
        if not round_.claimed:
            return sent_count, round_.wait
        results = relay_send(dest, round_.claimed)
        sent_count += len(results)
