"""What a destination's limits decide, in one place and in Python: its row after a round's
answers (the breaker, the failing span and retirement), its token bucket now, and how
many messages a claim may take. Pure functions of the row as the round locked it, the
round's verdicts and the time: the round (round.py) reads the row, asks here, and writes
what is decided; no statement decides any of it again.

The breaker is breaker.py's (``breaker_after``), asked here for the row after the
answers, and again, from that row, for what the claim may take. Retirement (retirement.py's
notices and lines): a 410 Gone disables the destination at once; failures with no
success since before ``DISABLE_AFTER_FAILING_DAYS`` disable it too, and past
``DISABLE_WARNING_FRACTION`` of that span they are warned of, once. The bucket: at most
``rate_count`` starts per ``rate_seconds``, holding at most ``burst`` (at least one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from ...conf import app_settings
from ..breaker import breaker_after
from ..models import MessageStatus, WebhookDestination
from ..retirement import GONE_REASON, failing_reason
from .policy import Decision

# a refill's float arithmetic drifts by a few ulps: a bucket this close to a whole token
# holds it (else a 5/s bucket could claim one message a round where two are due)
TOKEN_EPSILON = 1e-9


@dataclass(frozen=True)
class After:
    """A destination's row after a round's answers: what the round writes back, and
    what happened to it (for the log lines and notices)."""

    consecutive_failures: int
    paused_until: datetime | None
    last_success_at: datetime | None
    last_failure_at: datetime | None
    failing_since: datetime | None
    failing_warned_at: datetime | None
    enabled: bool
    disabled_reason: str
    disabled_at: datetime | None
    # the answers counted (a round of none leaves the row as it was)
    counted: bool = False
    # this round paused the destination (its breaker opened, or opened again)
    opened: bool = False
    # the reason this round disabled it (None: it did not), and whether it warned
    retired: str | None = None
    warned: bool = False


def after_answers(dest: WebhookDestination, verdicts: list[Decision], now: datetime) -> After:
    """The destination's breaker, failing span and retirement after ``verdicts``."""
    successes = sum(v.status == MessageStatus.DELIVERED for v in verdicts)
    failures = sum(v.breaker_failure for v in verdicts)
    gone = sum(v.gone for v in verdicts)
    breaker = breaker_after(
        dest,
        dest.consecutive_failures,
        dest.paused_until,
        now,
        successes=successes,
        failures=failures,
    )
    failing = not successes and failures > 0
    span = app_settings().disable_after_failing
    since = dest.failing_since  # as it was before this round
    retired = None
    if dest.enabled and gone:
        retired = GONE_REASON
    elif dest.enabled and failing and span and since is not None and since <= now - span:
        retired = failing_reason()
    warn_before = now - span * app_settings().disable_warning_fraction if span else None
    warned = (
        failing
        and dest.failing_warned_at is None
        and since is not None
        and warn_before is not None
        and since <= warn_before
    )
    if successes:
        failing_since, failing_warned_at = None, None
    else:
        failing_since = (since or now) if failures else since
        failing_warned_at = now if warned else dest.failing_warned_at
    return After(
        consecutive_failures=breaker.consecutive_failures,
        paused_until=breaker.paused_until,
        last_success_at=now if successes else dest.last_success_at,
        last_failure_at=now if failing else dest.last_failure_at,
        failing_since=failing_since,
        failing_warned_at=failing_warned_at,
        enabled=dest.enabled and retired is None,
        disabled_reason=retired if retired is not None else dest.disabled_reason,
        disabled_at=now if retired is not None else dest.disabled_at,
        counted=bool(successes + failures + gone),
        opened=breaker.opened,
        retired=retired,
        warned=warned and retired is None,
    )


def refilled(dest: WebhookDestination, now: datetime) -> float:
    """The token bucket at ``now``: refilled at rate_count per rate_seconds since it was
    last written, holding at most ``burst`` (at least one) tokens. A new bucket is full."""
    capacity = max(1, dest.burst)
    if dest.tokens_at is None:
        return float(capacity)
    elapsed = max(0.0, (now - dest.tokens_at).total_seconds())
    return min(capacity, dest.tokens + elapsed * dest.rate_count / dest.rate_seconds)


@dataclass(frozen=True)
class Allowance:
    """What a claim may take now, before the requests in flight are counted (the
    round's statement counts them, under the row's lock): nothing while the destination
    is disabled or its breaker open; else up to ``allowed`` messages by its bucket and
    the round's limit, while fewer than ``in_flight_limit`` requests are in flight (the
    breaker's: one probe at a time while half-open)."""

    open: bool
    in_flight_limit: int
    tokens: float
    tokens_at: datetime | None
    allowed: int
    # the end of the breaker's pause, while it is open
    paused_until: datetime | None = None


def allowance(dest: WebhookDestination, after: After, now: datetime, limit: int) -> Allowance:
    breaker = breaker_after(dest, after.consecutive_failures, after.paused_until, now)
    if not after.enabled or breaker.state == "open" or limit <= 0:
        return Allowance(False, 0, dest.tokens, dest.tokens_at, 0, breaker.until)
    tokens = refilled(dest, now)
    # whole tokens, forgiving the float's last bits: 1.9999999999999982 is two
    allowed = max(0, min(limit, math.floor(tokens + TOKEN_EPSILON)))
    # the bucket's time never moves back: `now` may predate the last writer's
    tokens_at = max(now, dest.tokens_at) if dest.tokens_at is not None else now
    return Allowance(True, breaker.in_flight_limit, tokens, tokens_at, allowed)


def token_wait(dest: WebhookDestination, tokens_left: float, limit: int) -> float | None:
    """Out of tokens: how long until a round's worth is due (as many as its requests in
    flight may be, up to the burst and the round's limit), rather than the next single
    token, so that in a backlog one claim takes a batch, at the same rate. None while a
    whole token is left."""
    if tokens_left + TOKEN_EPSILON >= 1:
        return None
    batch = max(1, min(limit, dest.max_in_flight, max(1, dest.burst)))
    return (batch - tokens_left) * dest.rate_seconds / dest.rate_count
