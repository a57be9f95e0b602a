"""The circuit breaker, decided in one place (``breaker_after``): consecutive failures
past a destination's threshold pause it for its cool-down (open), after which one probe
at a time decides (half-open); a success closes it.

Its state lives on the destination's row (``consecutive_failures``, ``paused_until``).
A relay round decides it here from the row as it locked it and the round's answers
(relay/limits.py asks), and its statement writes what was decided; the admin and the
status read it here too (``destination_breaker``). What counts as a
success or a failure is what an answer means (relay/policy.py: a 410 Gone is neither).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from .models import WebhookDestination

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Breaker:
    state: str  # "closed", "open" or "half-open"
    # open: when the cool-down ends and one probe is let through (else None)
    until: datetime | None = None
    consecutive_failures: int = 0
    # the row's pause as written (a pause that has ended is left as it was)
    paused_until: datetime | None = None
    # the requests the destination may have in flight at once: none while open, one
    # while half-open (so a probe goes only when none is in flight), all of its
    # max_in_flight while closed. The round's statement subtracts the requests it
    # counts in flight, under the row's lock.
    in_flight_limit: int = 0
    # the answers that decided it opened it (or opened it again after a probe)
    opened: bool = False


def breaker_after(
    dest: WebhookDestination,
    consecutive_failures: int,
    paused_until: datetime | None,
    now: datetime,
    *,
    successes: int = 0,
    failures: int = 0,
) -> Breaker:
    """The breaker of ``dest`` (its threshold, cool-down and max_in_flight) whose row
    holds ``consecutive_failures`` and ``paused_until``, after a round's answers (none:
    as it stands at ``now``). Any success closes it; otherwise failures add to the
    consecutive ones, and once those reach the threshold the destination pauses for
    the cool-down from ``now`` (again, after a failed probe). It is open while paused,
    half-open once the pause has ended and the count is still at the threshold, and
    closed below it."""
    opened = False
    if successes:
        consecutive_failures, paused_until = 0, None
    elif failures:
        consecutive_failures += failures
        opened = consecutive_failures >= dest.breaker_threshold
        paused_until = now + timedelta(seconds=dest.breaker_cooldown_seconds) if opened else None
    if paused_until is not None and paused_until > now:
        return Breaker("open", paused_until, consecutive_failures, paused_until, 0, opened)
    if consecutive_failures >= dest.breaker_threshold:
        return Breaker("half-open", None, consecutive_failures, paused_until, 1, opened)
    return Breaker("closed", None, consecutive_failures, paused_until, dest.max_in_flight, opened)


def destination_breaker(destination: WebhookDestination, *, now: datetime | None = None) -> Breaker:
    """The breaker as its row holds it at ``now``, as the relay's next round reads it."""
    return breaker_after(
        destination,
        destination.consecutive_failures,
        destination.paused_until,
        now or timezone.now(),
    )


def breaker_opened_log(dest: WebhookDestination, consecutive_failures: int) -> None:
    """The breaker's one WARNING line as it opens (or opens again after a probe)."""
    logger.warning(
        "destination %s paused for %ss after %d consecutive failures",
        dest.name,
        dest.breaker_cooldown_seconds,
        consecutive_failures,
    )
