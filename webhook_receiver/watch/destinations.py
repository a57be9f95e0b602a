"""Each destination's state and why, for the overview and ``manage.py webhook_status``:
the same levels and reasons as the sources' (watch/sources.py).

One query for every destination (``destinations_with_health``: only pending, sending
and failed messages are read, through the (destination, status, id) index), and one more
when failed messages hold back later ones of their ordering key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..core.states import Reason, State, worst_state
from ..core.words import iso, seconds
from ..outbound.breaker import Breaker, destination_breaker
from ..outbound.encryption import stored_secrets_problem, with_stored_secrets
from ..outbound.models import OutboxMessage, WebhookDestination
from ..outbound.selectors import destinations_with_health, failed_holding_back
from .conditions import DESTINATION_CONDITIONS, RECORD_FAILURE_SHOWN, reasons
from .pickup import relay_pickup
from .readings import Readings, read_unbounded

if TYPE_CHECKING:
    from ..outbound.selectors import DestinationWithHealth


@dataclass(frozen=True)
class DestinationStatus:
    name: str
    pk: int
    enabled: bool
    now: datetime
    backlog: int  # pending and sending
    failed: int  # terminal, waiting for an operator
    oldest_eligible_at: datetime | None  # created_at of the oldest message due now
    breaker: Breaker
    # how long a running relay leaves a due message without an answer (watch/pickup.py)
    pickup: timedelta
    # the last answer of either kind: the relay is sending at all
    last_success_at: datetime | None
    last_failure_at: datetime | None
    # the earliest due time among the messages the relay would send now
    oldest_due_at: datetime | None = None
    # from when a running relay owes an answer: its last answer, the end of the
    # breaker's pause, the destination's last change (enabled again), or, with every
    # slot held by a lease, those leases running out (a stopped worker's included)
    owed_since: datetime | None = None
    # pending messages behind a failed one of their ordering key; the failed messages
    # holding them back, and the oldest of those (its id, key and ordering key)
    held_back: int = 0
    holding_back: int = 0
    first_holder: tuple[int, str, str] | None = None
    # the last round of answers the relay could not record, and why
    record_failed_at: datetime | None = None
    record_error: str = ""
    # why and when the relay disabled it (410 Gone, a failing span); "" when it did not
    disabled_reason: str = ""
    disabled_at: datetime | None = None
    # why no configured key decrypts its secrets (outbound/encryption.py), or ""
    secrets_unreadable: str = ""
    reasons: tuple[Reason, ...] = field(default=())

    @property
    def state(self) -> State:
        return worst_state(self.reasons)

    @property
    def oldest_eligible_age(self) -> timedelta | None:
        at = self.oldest_eligible_at
        return None if at is None else self.now - at

    @property
    def due_age(self) -> timedelta | None:
        """How long the relay has had a message to send (0 or more), or None."""
        at = self.oldest_due_at
        return None if at is None else max(timedelta(0), self.now - at)

    @property
    def last_attempt_at(self) -> datetime | None:
        moments = [m for m in (self.last_success_at, self.last_failure_at) if m is not None]
        return max(moments) if moments else None

    @property
    def disabled_by_relay(self) -> bool:
        return not self.enabled and bool(self.disabled_reason)

    @property
    def record_failing(self) -> bool:
        """The relay's last round could not be recorded, recently, and no answer has
        been recorded since."""
        at, last = self.record_failed_at, self.last_attempt_at
        return (
            at is not None and self.now - at <= RECORD_FAILURE_SHOWN and (last is None or at > last)
        )

    def as_dict(self) -> dict[str, Any]:
        """The stable machine shape (``webhook_status --json``; docs/watching.md)."""
        age = self.oldest_eligible_age
        return {
            "destination": self.name,
            "enabled": self.enabled,
            "disabled_by_relay": {"reason": self.disabled_reason, "at": iso(self.disabled_at)}
            if self.disabled_by_relay
            else None,
            "state": self.state.label,
            "reasons": [r.as_dict() for r in self.reasons],
            "backlog": self.backlog,
            "failed": self.failed,
            "held_back": self.held_back,
            "oldest_eligible_age_seconds": None if age is None else age.total_seconds(),
            "due_age_seconds": seconds(self.due_age),
            "pickup_seconds": self.pickup.total_seconds(),
            "breaker": {
                "state": self.breaker.state,
                "until": self.breaker.until.isoformat() if self.breaker.until else None,
                "consecutive_failures": self.breaker.consecutive_failures,
            },
            "last_success_at": iso(self.last_success_at),
            "last_failure_at": iso(self.last_failure_at),
            "record_failure": {"at": iso(self.record_failed_at), "error": self.record_error}
            if self.record_failing
            else None,
        }


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
    unreadable = stored_secrets_problem(getattr(dest, "stored_secrets", None))
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
