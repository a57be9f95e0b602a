"""The claim: what a destination's limits allow now, oldest first, each message leased.

The destination's row is locked (its token bucket and in-flight count live on it: one
claimer at a time) and its eligible messages are claimed in one statement
(``queries.CLAIM``): pending and due, or leased by a worker whose lease ran out. A
message whose ordering key has an older open message waits for it. A lease that ran out
counts as a failed attempt; one that spends the last of the budget fails the message
here rather than send it again.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.db import connection, transaction
from django.utils import timezone

from ...core import faults
from .. import metrics, queries
from ..models import MessageStatus, OutboxMessage, WebhookDestination
from .messages import Claimed, RelayRound
from .policy import answer_log, ops_notice_terminal

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    class _InFlight(TypedDict):
        # the locking query's column: the destination's requests in flight
        in_flight: int


# a lease outlives the request's own timeout by this much
LEASE_MARGIN = timedelta(seconds=30)
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
    with faults.bounded_transaction():
        locked = queries.LOCKED_DESTINATION.get(
            (connection.vendor, skip_if_busy), queries.DESTINATION_WITH_IN_FLIGHT
        )
        rows = WebhookDestination.objects.raw(locked, params)
        dest = cast("WithAnnotations[WebhookDestination, _InFlight] | None", next(iter(rows), None))
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
        # whole tokens, forgiving the float's last bits: 1.9999999999999982 is two
        allowed = min(limit, slots, math.floor(tokens + TOKEN_EPSILON))
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
            cursor.execute(queries.TOKENS_SPENT, [tokens, adapt(tokens_at), dest.pk])
    wait = None
    if len(claimed) < limit and slots > len(claimed) and tokens + TOKEN_EPSILON < 1:
        # Out of tokens: the next run is for when a round's worth is due (as many as
        # the free slots take, up to the burst), not the next single token: in a
        # backlog one run then sends a batch, for the statements of one, at the same
        # rate.
        batch = max(1, min(limit, slots, max(1, dest.burst)))
        wait = (batch - tokens) * dest.rate_seconds / dest.rate_count
    return RelayRound(claimed=claimed, wait=wait)


def _spent_by_the_claim(dest: WebhookDestination, spent: list[Claimed]) -> None:
    """Messages the claim failed (their unrecorded attempt spent the budget): the notice,
    then, once committed, the log line and the count, as for any terminal answer."""
    for message in spent:
        ops_notice_terminal(dest, message, answer="attempt not recorded")

    def committed() -> None:
        for message in spent:
            then = f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
            answer_log(dest, message, "gave no recorded answer", then)
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
    claim = queries.CLAIM.format(
        eligible=queries.ELIGIBLE.get(connection.vendor, queries.ELIGIBLE_IDS)
    )
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
            traceparent=m.traceparent or "",
        )
        (spent if m.status == MessageStatus.FAILED else claimed).append(message)
    # RETURNING keeps no order: sent (and recorded) oldest first
    return sorted(claimed, key=lambda c: c.id), spent
