"""Each destination's state and why, for the overview and ``manage.py webhook_status``:
the same levels and reasons as the sources' (watch/sources.py).

One query for every destination (``destinations_with_health``: only pending, sending
and failed messages are read, through the (destination, status, id) index), and one more
when failed messages hold back later ones of their ordering key.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..core.encryption import secrets_unreadable, with_stored_secrets
from ..outbound.breaker import destination_breaker
from ..outbound.models import OutboxMessage, WebhookDestination
from ..outbound.selectors import destinations_with_health, failed_holding_back
from .conditions import DESTINATION_CONDITIONS, reasons
from .pickup import relay_pickup
from .readings import Readings, read_unbounded
from .statuses import DestinationStatus

if TYPE_CHECKING:
    from ..outbound.selectors import DestinationWithHealth


# the readings a destination's status is made of (watch/readings.py)
DESTINATIONS = "destinations and their outbox"
HELD_BACK = "held-back messages"


def destination_statuses(
    *, now: datetime | None = None, readings: Readings | None = None
) -> list[DestinationStatus]:
    """One status per destination, by name. With ``readings``, each part within its
    bound: no destinations when they could not be read (``readings`` names them), and
    none held back when the holders could not be."""
    now = now or timezone.now()

    def rows_read() -> list[Any]:
        # the secrets as stored, not decrypted as they are read: a status needs none of
        # them, only whether the keys read them (a row no key reads is a reason, not a
        # failure)
        every = with_stored_secrets(WebhookDestination.objects.order_by("name"))
        return list(destinations_with_health(every, now=now))

    read = readings.read if readings is not None else read_unbounded
    rows: list[Any] = read(DESTINATIONS, [WebhookDestination, OutboxMessage], rows_read, [])
    holders: dict[int, tuple[int, OutboxMessage]] = read(
        HELD_BACK,
        [OutboxMessage],
        lambda: failed_holding_back(d.pk for d in rows if d.held_back),
        {},
    )
    return [destination_status(dest, now=now, holders=holders) for dest in rows]


def destination_status(
    dest: DestinationWithHealth,
    *,
    now: datetime,
    holders: dict[int, tuple[int, OutboxMessage]] | None = None,
) -> DestinationStatus:
    """A destination's status and reasons, from a row of destinations_with_health()
    (read with_stored_secrets) and, for the held_back reason's words, the failed
    messages holding others back (failed_holding_back)."""
    holding_back, first = (holders or {}).get(dest.pk, (0, None))
    unreadable = secrets_unreadable(dest)
    held = dest.leases_until if dest.sending >= dest.max_in_flight else None
    moments = (dest.last_success_at, dest.last_failure_at, dest.paused_until, dest.updated_at)
    owed = [m for m in (*moments, held) if m is not None]
    status = DestinationStatus(
        name=dest.name,
        pk=dest.pk,
        enabled=dest.enabled,
        now=now,
        backlog=dest.backlog,
        failed=dest.failed_count,
        oldest_eligible_at=dest.oldest_eligible_at,
        oldest_due_at=dest.oldest_due_at,
        owed_since=max(owed) if owed else None,
        breaker=destination_breaker(dest, now=now),
        pickup=relay_pickup(dest),
        last_success_at=dest.last_success_at,
        last_failure_at=dest.last_failure_at,
        held_back=dest.held_back,
        holding_back=holding_back,
        first_holder=None if first is None else (first.pk, first.key, first.ordering_key),
        record_failed_at=dest.record_failed_at,
        record_error=dest.record_error,
        disabled_reason=dest.disabled_reason,
        disabled_at=dest.disabled_at,
        secrets_unreadable="" if unreadable is None else unreadable.state,
    )
    return replace(status, reasons=reasons(DESTINATION_CONDITIONS, status))
