"""The circuit breaker: consecutive failures past a destination's threshold pause it for
its cool-down, after which one probe at a time decides; a success closes it.

Its state lives on the destination's row, written under that row's lock by the relay's
record (``breaker_record``) and read by the claim, the admin, the status and metrics
(``destination_breaker``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from . import queries
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


def breaker_record(
    dest: WebhookDestination, *, successes: int, failures: int, now: datetime
) -> None:
    """A success closes the breaker; consecutive failures past the threshold open it for
    the cool-down (after which relay_claim lets one probe through)."""
    if successes:
        with connection.cursor() as cursor:
            last_success = connection.ops.adapt_datetimefield_value(now)
            cursor.execute(queries.BREAKER_CLOSED, [last_success, dest.pk])
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
