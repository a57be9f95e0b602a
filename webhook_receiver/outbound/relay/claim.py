"""The claim: what a destination's limits allow now, oldest first, each message leased.

Under the destination row's lock (its token bucket and in-flight count live on it: one
claimer at a time), the bucket is refilled, the breaker and the requests in flight on
every worker (its unexpired leases) are counted, and the eligible messages are leased:
pending and due, or leased by a worker whose lease ran out. A message whose ordering
key has an older open message waits for it. A lease that ran out counts as a failed
attempt; one that spends the last of the budget fails the message here rather than
send it again.

On PostgreSQL that is one statement (``queries.CLAIM``), which also records the last
round's answers (``recording``: record.py prepares them) and returns the destination's
row, so that a run reads it nowhere else. On SQLite, which has no data-modifying CTE, it
is three in one IMMEDIATE transaction (``_claim_sqlite``), after the record's own: the
row is read, its limits computed here, to the same float operations as the statement's,
then the lease and the bucket written.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ...conf import app_settings
from ...core import bounds
from .. import metrics, queries
from ..breaker import destination_breaker
from ..models import MessageStatus, OutboxMessage, WebhookDestination
from ..retirement import NO_RETIREMENT, Retirement
from .messages import Claimed, RelayRound
from .reporting import log_answer, notify_terminal

# a lease outlives the request's own timeout by lease_margin(); this much when the
# statements are not bounded (LOCK_TIMEOUT_MS or STATEMENT_TIMEOUT_MS of 0)
LEASE_MARGIN = timedelta(seconds=30)
# the run's own work between an answer and its record's statement (a GC pause, a thread
# waiting for the interpreter), beyond the statements' bounds
RECORD_SLACK = timedelta(seconds=3)
# messages claimed (and sent concurrently) a round at most
CLAIM_BATCH = 10
# a refill's float arithmetic drifts by a few ulps: a bucket this close to a whole
# token holds it (else a 5/s bucket could claim one message a run where two are due)
TOKEN_EPSILON = 1e-9
# the last error of a message whose unrecorded attempt spent its budget
UNRECORDED = (
    "its last attempt was never recorded (the worker stopped, or the database refused "
    "its answer), and that spent its retry budget"
)


@dataclass(frozen=True)
class _Leased:
    """What one claim did: the destination's row as it read it, whether its limits let
    it claim at all (enabled, not paused), its free slots and the bucket it left, the
    messages to send and those it failed instead (their budget spent)."""

    dest: WebhookDestination
    open: bool
    slots: int = 0
    tokens: float = 0.0
    claimed: list[Claimed] = field(default_factory=list)
    spent: list[Claimed] = field(default_factory=list)
    recorded: frozenset[int] = frozenset()
    counted_failures: int | None = None
    busy: bool = False
    retirement: Retirement = Retirement()


def relay_claim(
    *,
    destination: WebhookDestination | int,
    now: datetime | None = None,
    limit: int = CLAIM_BATCH,
    skip_if_busy: bool = False,
    recording: dict[str, Any] | None = None,
) -> RelayRound:
    """Claim what the destination's limits allow now (see the module's docstring).

    With ``skip_if_busy``, a destination whose row another worker holds is left to that
    worker (``busy``): a burst of triggers then costs a statement each, not a queue of
    runs waiting for one lock. ``recording`` (PostgreSQL) is the last round's answers
    and breaker count, as record.py makes them for ``queries.CLAIM``: recorded by the
    same statement, which then waits for the row's lock rather than skip it."""
    now = now or timezone.now()
    destination_id = destination if isinstance(destination, int) else destination.pk
    params = {
        "destination_id": destination_id,
        "now": connection.ops.adapt_datetimefield_value(now),
        "limit": limit,
        "unrecorded": UNRECORDED,
    }
    # no savepoint: relay_destination runs this in its round's transaction
    with bounds.bounded_transaction():
        if connection.vendor == "postgresql":
            leased = _claim_postgresql(
                # the claim's now for the whole statement (the answers' verdicts were
                # made a moment before it)
                {**NO_ANSWER, **(recording or {}), **params},
                now,
                skip_if_busy=skip_if_busy and not recording,
            )
        else:
            leased = _claim_sqlite(params, now)
        if leased is None:
            return RelayRound(claimed=[], busy=True)
        if leased.spent:
            _report_spent(leased.dest, leased.spent)
    dest, claimed = leased.dest, leased.claimed
    recorded = RelayRound(
        claimed=[],
        recorded=leased.recorded,
        counted_failures=leased.counted_failures,
        retirement=leased.retirement,
    )
    if leased.busy:
        return replace(recorded, busy=True)
    if not leased.open:
        return replace(recorded, destination=dest)
    wait = None
    if len(claimed) < limit and leased.slots > len(claimed) and leased.tokens + TOKEN_EPSILON < 1:
        # Out of tokens: the next run is for when a round's worth is due (as many as
        # the free slots take, up to the burst), not the next single token: in a
        # backlog one run then sends a batch, for the statements of one, at the same
        # rate.
        batch = max(1, min(limit, leased.slots, max(1, dest.burst)))
        wait = (batch - leased.tokens) * dest.rate_seconds / dest.rate_count
    return replace(recorded, claimed=claimed, wait=wait, destination=dest)


# the statement's parameters for a claim that records no answer
NO_ANSWER: dict[str, Any] = {
    "answers": "[]",
    "round_successes": 0,
    "round_failures": 0,
    "threshold": 0,
    "paused_until": None,
    **NO_RETIREMENT,
}


def _claim_postgresql(
    params: dict[str, Any], now: datetime, *, skip_if_busy: bool
) -> _Leased | None:
    """The claim's one statement; None when another worker holds the destination (and
    this one recorded no answer)."""
    params = {**params, "lease_margin": lease_margin(), "token_epsilon": TOKEN_EPSILON}
    row = _claim_row(_statement(skip_if_busy), params)
    if row is None:
        return None
    recorded, counted = frozenset(row.recorded), row.counted_failures
    retirement = Retirement(row.retired, bool(row.warned))
    if row.open and not row.current:
        # Another claim committed after this statement's snapshot was taken (it waited
        # for the lock, or came an instant late): the snapshot cannot count that claim's
        # leases, so it claimed nothing (its answers are recorded all the same). Again,
        # with no answer, the lock held: the new snapshot sees them. And at the time it
        # runs: a claim's tokens are spent at its `now`, and its requests start after it
        # commits; a `now` from before the wait would have them start later than the
        # bucket counts, beside the next claim's (two workers' starts over the bucket).
        now = timezone.now()
        again = {**params, **NO_ANSWER, "now": connection.ops.adapt_datetimefield_value(now)}
        row = _claim_row(_statement(skip_if_busy), again) or row
    if row.open and not row.current:
        if not recorded and counted is None:
            return None
        # a third claimer came between: it holds the destination now
        return _Leased(
            row,
            False,
            busy=True,
            recorded=recorded,
            counted_failures=counted,
            retirement=retirement,
        )
    claimed, spent = _messages(json.loads(row.claimed) if row.claimed else [], now)
    tokens = row.tokens_left if row.tokens_left is not None else 0.0
    return _Leased(
        row, row.open, row.slots, tokens, claimed, spent, recorded, counted, retirement=retirement
    )


def lease_margin() -> timedelta:
    """How long a lease outlives its request's deadline: as long as the request's record
    may take to commit, so that no other worker claims a message whose answer is on its
    way to the table. From the claim's ``now`` to the record's commit, three statements
    may each wait their bounds (LOCK_TIMEOUT_MS + STATEMENT_TIMEOUT_MS): the claim's own
    (the requests start after it commits), one the run is in when the answer comes, and
    the answer's record; then RECORD_SLACK. With the default bounds (2 s and 5 s), 24 s.
    A record later than that has failed at its bounds and the message goes again, under
    its key; a worker stopped longer (SIGSTOP) finds its record fenced off by the claim
    that took over."""
    settings = app_settings()
    bound_ms = settings.lock_timeout_ms + settings.statement_timeout_ms
    if not settings.lock_timeout_ms or not settings.statement_timeout_ms:
        return LEASE_MARGIN
    return timedelta(milliseconds=3 * bound_ms) + RECORD_SLACK


def _statement(skip_if_busy: bool) -> str:
    return queries.CLAIM[skip_if_busy].format(eligible=queries.ELIGIBLE["postgresql"])


def _claim_row(statement: str, params: dict[str, Any]) -> Any:
    """The statement's one row: the destination (typed as the model's fields are, its
    secrets decrypted), with the claim's columns beside its fields; None when another
    worker holds it."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        names = [column.name for column in cursor.description]
        values = cursor.fetchone()
    row: Any = _destination_from_row(dict(zip(names, values, strict=True)))
    if row.pk is None:
        if not row.found:
            raise WebhookDestination.DoesNotExist(f"no destination {params['destination_id']}")
        return None
    return row


def _destination_from_row(row: dict[str, Any]) -> WebhookDestination:
    """The destination of a row that holds its columns (``d.*``), each converted as the
    model reads it, the row's other columns set beside its fields: what ``raw()`` makes,
    without resolving the columns again each round."""
    attnames, converters, columns = _destination_fields()
    values = [
        row[column] if convert is None else convert(row[column], None, connection)
        for column, convert in converters
    ]
    dest = WebhookDestination.from_db(connection.alias, attnames, values)
    for name, value in row.items():
        if name not in columns:
            setattr(dest, name, value)
    return dest


@functools.cache
def _destination_fields() -> tuple[list[str], list[tuple[str, Any]], frozenset[str]]:
    """The model's attribute names, its columns with their converters, and the columns."""
    fields = WebhookDestination._meta.concrete_fields
    return (
        [field.attname for field in fields],
        [(field.column, getattr(field, "from_db_value", None)) for field in fields],
        frozenset(field.column for field in fields),
    )


def _messages(
    rows: list[dict[str, Any]], claimed_at: datetime
) -> tuple[list[Claimed], list[Claimed]]:
    """The claimed rows, oldest first (as the statement aggregated them): the messages
    to send, and those the claim failed instead."""
    claimed: list[Claimed] = []
    spent: list[Claimed] = []
    for m in rows:
        message = Claimed(
            id=m["id"],
            key=m["key"],
            event_type=m["event_type"],
            payload=m["payload"],
            attempt=m["attempts"],
            failures=m["failures"],
            created_at=datetime.fromisoformat(m["created_at"]),
            traceparent=m["traceparent"] or "",
            claimed_at=claimed_at,
        )
        (spent if m["status"] == MessageStatus.FAILED else claimed).append(message)
    return claimed, spent


def _claim_sqlite(params: dict[str, Any], now: datetime) -> _Leased:
    """SQLite: the row, what its limits allow (as ``queries.CLAIM``'s ``allowance``
    computes it), the lease and the bucket, in the caller's IMMEDIATE transaction."""
    adapt = connection.ops.adapt_datetimefield_value
    rows = WebhookDestination.objects.raw(queries.DESTINATION_WITH_IN_FLIGHT, params)
    dest: Any = next(iter(rows), None)
    if dest is None:
        raise WebhookDestination.DoesNotExist(f"no destination {params['destination_id']}")
    breaker = destination_breaker(dest, now=now)
    if not dest.enabled or breaker.state == "open":
        return _Leased(dest, open=False)
    slots = dest.max_in_flight - dest.in_flight
    if breaker.state == "half-open":  # one probe decides
        slots = min(slots, 1 if dest.in_flight == 0 else 0)
    tokens = _refilled(dest, now)
    # whole tokens, forgiving the float's last bits: 1.9999999999999982 is two
    allowed = min(params["limit"], slots, math.floor(tokens + TOKEN_EPSILON))
    claimed: list[Claimed] = []
    spent: list[Claimed] = []
    if allowed > 0:
        lease_until = now + timedelta(seconds=dest.timeout_seconds) + lease_margin()
        statement = queries.LEASE_ALLOWED.format(
            eligible=queries.ELIGIBLE.get(connection.vendor, queries.ELIGIBLE_IDS)
        )
        leased = OutboxMessage.objects.raw(
            statement,
            {
                **params,
                "allowed": allowed,
                "lease_until": adapt(lease_until),
                "max_attempts": dest.max_attempts,
            },
        )
        # RETURNING keeps no order: sent (and recorded) oldest first
        for m in sorted(leased, key=lambda m: m.id):
            message = Claimed(
                id=m.id,
                key=m.key,
                event_type=m.event_type,
                payload=m.payload,
                attempt=m.attempts,
                failures=m.failures,
                created_at=m.created_at,
                traceparent=m.traceparent or "",
                claimed_at=now,
            )
            (spent if m.status == MessageStatus.FAILED else claimed).append(message)
    tokens -= len(claimed)
    # never back in time: `now` may predate the last writer's, and a span refills once
    tokens_at = max(now, dest.tokens_at or now)
    with connection.cursor() as cursor:
        cursor.execute(queries.TOKENS_SPENT, [tokens, adapt(tokens_at), dest.pk])
    return _Leased(dest, True, slots, tokens, claimed, spent)


def _refilled(dest: WebhookDestination, now: datetime) -> float:
    """SQLite's token bucket at ``now``, as ``queries.REFILLED`` computes it on
    PostgreSQL: refilled at rate_count per rate_seconds since it was last written,
    holding at most ``burst`` (at least one) tokens. A new bucket is full."""
    capacity = max(1, dest.burst)
    if dest.tokens_at is None:
        return float(capacity)
    elapsed = max(0.0, (now - dest.tokens_at).total_seconds())
    return min(capacity, dest.tokens + elapsed * dest.rate_count / dest.rate_seconds)


def _report_spent(dest: WebhookDestination, spent: list[Claimed]) -> None:
    """Messages the claim failed (their unrecorded attempt spent the budget): the notice,
    then, once committed, the log line and the count, as for any terminal answer."""
    for message in spent:
        notify_terminal(dest, message, answer="attempt not recorded")

    def committed() -> None:
        for message in spent:
            then = f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
            log_answer(dest, message, "gave no recorded answer", then)
            metrics.terminal_count(dest.name)

    transaction.on_commit(committed)
