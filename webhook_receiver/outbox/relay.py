"""The relay: claim a destination's eligible messages, send them with no transaction
open, record what each answer means.

One round for one destination:

1. ``relay_claim`` (one short transaction): lock the destination's row, refill its
   token bucket, count its unexpired leases (the requests in flight on every worker),
   and claim as many eligible messages as both limits allow, oldest first, with
   ``FOR UPDATE SKIP LOCKED`` on PostgreSQL. A message whose ordering key has an older
   open message waits for it. Each claimed message gets a lease: a worker that dies
   holds it only until the lease ends, and the message is then claimed again, under
   the same key.
2. ``relay_send``: the HTTP requests, concurrently up to the claim's size, on a client
   kept per destination (connection reuse). No transaction is open.
3. ``relay_record`` (one short transaction): delivered, deferred (Retry-After, or
   backoff with full jitter) or terminal, one attempt row each, and the breaker.

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
from django.db.models import F
from django.utils import timezone

from ..signatures.standard import StandardWebhooks
from . import metrics
from .models import DeliveryAttempt, MessageStatus, OutboxMessage, WebhookDestination
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
# PostgreSQL: rows another worker is claiming are skipped, not waited for. (SQLite
# serialises writers: its IMMEDIATE transactions do the same job.)
ELIGIBLE = {"postgresql": _ELIGIBLE + " FOR UPDATE OF m SKIP LOCKED", "sqlite": _ELIGIBLE}

# Requests in flight for a destination, on every worker: its unexpired leases.
IN_FLIGHT = """
    SELECT count(*) FROM webhook_receiver_outboxmessage
    WHERE destination_id = %(destination_id)s AND status = 'sending'
      AND lease_until > %(now)s
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
    with transaction.atomic():
        # the limiter's state lives on this row: one claimer per destination at a time
        dest = (
            WebhookDestination.objects.select_for_update(skip_locked=skip_if_busy)
            .filter(pk=destination_id)
            .first()
        )
        if dest is None:
            if not WebhookDestination.objects.filter(pk=destination_id).exists():
                raise WebhookDestination.DoesNotExist(f"no destination {destination_id}")
            return RelayRound(claimed=[], busy=True)
        if not dest.enabled or (dest.paused_until and dest.paused_until > now):
            return RelayRound(claimed=[])
        # adapted as the ORM stores it (SQLite compares datetimes as text)
        params = {"destination_id": dest.pk, "now": connection.ops.adapt_datetimefield_value(now)}
        with connection.cursor() as cursor:
            cursor.execute(IN_FLIGHT, params)
            in_flight = cursor.fetchone()[0]
        slots = dest.max_in_flight - in_flight
        if dest.consecutive_failures >= dest.breaker_threshold:
            # half-open after the cool-down: one probe decides
            slots = min(slots, 1 if in_flight == 0 else 0)
        tokens = _refilled(dest, now)
        allowed = min(limit, slots, math.floor(tokens))
        claimed: list[Claimed] = []
        if allowed > 0:
            claimed = _claim_rows(dest, now, params, allowed)
        tokens -= len(claimed)
        # never back in time: `now` may predate the last writer's (read before this lock
        # was waited for, or on a host whose clock is behind), and a span refills once
        tokens_at = max(now, dest.tokens_at or now)
        WebhookDestination.objects.filter(pk=dest.pk).update(tokens=tokens, tokens_at=tokens_at)
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


def _claim_rows(
    dest: WebhookDestination, now: datetime, params: dict[str, Any], allowed: int
) -> list[Claimed]:
    lease_until = now + timedelta(seconds=dest.timeout_seconds) + LEASE_MARGIN
    with connection.cursor() as cursor:
        eligible = ELIGIBLE.get(connection.vendor, _ELIGIBLE)
        cursor.execute(eligible, {**params, "limit": allowed})
        ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return []
    claimed = OutboxMessage.objects.filter(pk__in=ids)
    # each claim is an attempt, counted now: its number fences the claim's result
    claimed.update(
        status=MessageStatus.SENDING, lease_until=lease_until, attempts=F("attempts") + 1
    )
    rows = claimed.order_by("id").values_list(
        "id", "key", "event_type", "payload", "attempts", "failures", "created_at"
    )
    return [
        Claimed(id=i, key=k, event_type=t, payload=p, attempt=a, failures=f, created_at=c)
        for i, k, t, p, a, f, c in rows
    ]


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
    """Record every answer of a round in one short transaction: the messages (only those
    still claimed: a lease that ran out may have been taken over), one attempt row each,
    and the destination's breaker."""
    if not results:
        return
    now = now or timezone.now()
    messages, attempts, verdicts = [], [], []
    successes = failures = 0
    for sent in results:
        v = verdict(dest, sent, now)
        verdicts.append(v)
        m = sent.message
        messages.append(
            OutboxMessage(
                pk=m.id,
                status=v.status,
                attempts=m.attempt,
                failures=m.failures + (1 if v.spends_budget else 0),
                next_attempt_at=v.next_attempt_at or now,
                lease_until=None,
                delivered_at=now if v.status == MessageStatus.DELIVERED else None,
                last_status_code=sent.status_code,
                last_error=sent.error
                or ("" if v.status == MessageStatus.DELIVERED else sent.excerpt),
            )
        )
        attempts.append(
            DeliveryAttempt(
                message_id=m.id,
                number=m.attempt,
                started_at=sent.started_at,
                duration_ms=sent.duration_ms,
                status_code=sent.status_code,
                error=sent.error,
                response_excerpt=sent.excerpt,
                next_attempt_at=v.next_attempt_at,
            )
        )
        successes += v.status == MessageStatus.DELIVERED
        failures += v.breaker_failure
    fields = [
        "status",
        "attempts",
        "failures",
        "next_attempt_at",
        "lease_until",
        "delivered_at",
        "last_status_code",
        "last_error",
    ]
    # One UPDATE per distinct set of values: one a round when every answer is a 2xx (a
    # bulk_update's CASE per field and row costs more than the requests themselves).
    groups: dict[tuple[Any, ...], list[int]] = {}
    for message in messages:
        groups.setdefault(tuple(getattr(message, f) for f in fields), []).append(message.pk)
    current: set[int] = set()
    with transaction.atomic():
        for values, ids in groups.items():
            row = dict(zip(fields, values, strict=True))
            # A result lands only on a message that is still this claim's (sending, at
            # this attempt): a worker whose lease ran out (frozen, or held by a slow
            # answer) must not undo the claim that took over.
            still_ours = OutboxMessage.objects.filter(
                pk__in=ids, status=MessageStatus.SENDING, attempts=row["attempts"]
            )
            mine = list(still_ours.select_for_update().values_list("pk", flat=True))
            OutboxMessage.objects.filter(pk__in=mine).update(**row)
            current.update(mine)
        DeliveryAttempt.objects.bulk_create(attempts)
        _breaker_record(dest, successes=successes, failures=failures, now=now)
    for sent, v in zip(results, verdicts, strict=True):
        if sent.message.id not in current:
            continue
        if v.status == MessageStatus.DELIVERED:
            metrics.delivery_record(
                dest.name,
                created_at=sent.message.created_at,
                delivered_at=now,
                attempts=sent.message.attempt,
            )
        elif v.status == MessageStatus.FAILED:
            metrics.terminal_count(dest.name)
            _terminal_notice(dest, sent)


def _terminal_notice(dest: WebhookDestination, sent: Sent) -> None:
    """Tell the ops destination (if any); a failure here never fails the round."""
    answer = str(sent.status_code) if sent.status_code is not None else sent.error
    try:
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
    row = WebhookDestination.objects.filter(pk=dest.pk)
    if successes:
        row.update(consecutive_failures=0, paused_until=None, last_success_at=now)
    elif failures:
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
    None)."""
    deadline = time.monotonic() + budget_seconds
    dest = WebhookDestination.objects.get(pk=destination_id)
    sent_count = 0
    while time.monotonic() < deadline:
        # a worker already claiming for this destination carries on; this run stops
        round_ = relay_claim(destination=dest, skip_if_busy=True)
        if not round_.claimed:
            return sent_count, round_.wait
        results = relay_send(dest, round_.claimed)
        relay_record(dest, results)
        sent_count += len(results)
    return sent_count, 0.0
