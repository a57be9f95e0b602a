"""The circuit breaker: consecutive failures past a destination's threshold pause it for
its cool-down, after which one probe at a time decides; a success closes it.

Its state lives on the destination's row, written under that row's lock by the relay's
record (``breaker_count``, applied by the record's statement) and read by the claim, the
admin, the status and metrics (``destination_breaker``).
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
    # open: when the cool-down ends and one probe is let through
    until: datetime | None = None
    consecutive_failures: int = 0


def destination_breaker(destination: WebhookDestination, *, now: datetime | None = None) -> Breaker:
    """The circuit breaker as the relay applies it (relay_claim, relay_record): open while
    paused after ``breaker_threshold`` consecutive failures; half-open once the cool-down
    has passed and the count is still at the threshold (one probe at a time decides);
    closed otherwise."""
    now = now or timezone.now()
    failures = destination.consecutive_failures
    if destination.paused_until is not None and destination.paused_until > now:
        return Breaker("open", destination.paused_until, failures)
    if failures >= destination.breaker_threshold:
        return Breaker("half-open", None, failures)
    return Breaker("closed", None, failures)


@dataclass(frozen=True)
class BreakerCount:
    """A round's answers as the breaker counts them, for the record's statement
    (``queries.BREAKER_COUNT``) to apply on the destination's row, under its lock: any
    success closes the breaker; otherwise the failures add to the consecutive ones, and
    once those reach ``threshold`` the destination pauses until ``paused_until``."""

    successes: int
    failures: int
    threshold: int
    paused_until: datetime
    # answers of 410 Gone: they retire the destination (retirement.py), not count here
    gone: int = 0

    def opened(self, consecutive_failures: int | None) -> bool:
        """Whether the count the statement returned pauses the destination."""
        return (
            not self.successes
            and self.failures > 0
            and consecutive_failures is not None
            and consecutive_failures >= self.threshold
        )


def breaker_count(
    dest: WebhookDestination, *, successes: int, failures: int, now: datetime, gone: int = 0
) -> BreakerCount:
    """A success closes the breaker; consecutive failures past the threshold open it for
    the cool-down (after which relay_claim lets one probe through)."""
    return BreakerCount(
        successes=successes,
        failures=failures,
        threshold=dest.breaker_threshold,
        paused_until=now + timedelta(seconds=dest.breaker_cooldown_seconds),
        gone=gone,
    )


def breaker_opened_log(dest: WebhookDestination, consecutive_failures: int) -> None:
    """The breaker's one WARNING line as it opens (or opens again after a probe)."""
    logger.warning(
        "destination %s paused for %ss after %d consecutive failures",
        dest.name,
        dest.breaker_cooldown_seconds,
        consecutive_failures,
    )
