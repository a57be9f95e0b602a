"""The whole status, as ``webhook_status`` and the overview show it: the sources, the
destinations, and what they all depend on (Celery's broker, beat's heartbeat, a relay
process), each part a reading bounded on its own (watch/readings.py), and the verdict
over all of them.

Nothing is OK while the broker does not answer (nothing is retried or swept), while
beat's heartbeat is older than heartbeat_stale_after (two of its intervals), or, when
there is a destination to send to, while no relay process has been seen for
RELAY_STALE_AFTER: those are the whole's own reasons, at the verdict's head.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from health_check.exceptions import ServiceUnavailable

from ..conf import app_settings
from ..core.states import Reason, State
from ..outbound.models import WebhookDestination
from ..presentation.display import duration_text, iso, seconds
from .destinations import destination_statuses
from .health import Broker
from .heartbeat import heartbeat_interval, heartbeat_seen_at, heartbeat_stale_after
from .models import Heartbeat
from .readings import Readings, Unread
from .relays import RELAY_STALE_AFTER, relay_needed, relays_seen_at
from .sources import source_statuses
from .statuses import DestinationStatus, SourceStatus
from .verdict import Headline, status_verdict

HEARTBEAT = "heartbeat"
RELAYS = "relays"


@dataclass(frozen=True)
class BeatReading:
    seen_at: datetime | None
    stale_after: timedelta
    interval: timedelta | None
    read: bool  # False: the heartbeat could not be read (``unread`` says why)

    def age(self, now: datetime) -> timedelta | None:
        return None if self.seen_at is None else now - self.seen_at


@dataclass(frozen=True)
class RelayReading:
    # the newest relay heartbeat (None: none recorded)
    seen_at: datetime | None
    # a destination exists for a relay to send to
    needed: bool
    read: bool

    def age(self, now: datetime) -> timedelta | None:
        return None if self.seen_at is None else now - self.seen_at


@dataclass(frozen=True)
class Status:
    now: datetime
    sources: list[SourceStatus]
    destinations: list[DestinationStatus]
    beat: BeatReading
    relays: RelayReading
    # None: the broker answered; else why it did not
    broker_error: str | None
    system: tuple[Reason, ...]
    unread: list[Unread]
    verdict: Headline

    def as_dict(self) -> dict[str, Any]:
        """``webhook_status --json`` (docs/watching.md)."""
        age = self.beat.age(self.now)
        return {
            "generated_at": self.now.isoformat(),
            "state": self.verdict.label,
            "verdict": self.verdict.text,
            "exit_code": self.verdict.exit_code,
            "sources": [s.as_dict() for s in self.sources],
            "destinations": [d.as_dict() for d in self.destinations],
            "reasons": [r.as_dict() for r in self.system],
            "unread": [u.as_dict() for u in self.unread],
            "broker": {"reachable": self.broker_error is None, "error": self.broker_error},
            "beat": {
                "seen_at": iso(self.beat.seen_at),
                "age_seconds": seconds(age),
                "stale_after_seconds": seconds(self.beat.stale_after),
                "interval_seconds": seconds(self.beat.interval),
            }
            if self.beat.read
            else None,
            "relay": {
                "seen_at": iso(self.relays.seen_at),
                "age_seconds": seconds(self.relays.age(self.now)),
                "stale_after_seconds": seconds(RELAY_STALE_AFTER),
            }
            if self.relays.read
            else None,
        }


def status_read(*, now: datetime | None = None, readings: Readings | None = None) -> Status:
    """Every part of the status, each within STATUS_TIMEOUT_SECONDS: first which of the
    app's tables are locked (so that one lock costs one bound), then each reading.
    ``readings``: the caller's, to read more parts on the same bounds (the overview)."""
    now = now or timezone.now()
    bound = app_settings().status_timeout_seconds
    readings = readings or Readings(bound)
    readings.tables_probe()
    sources = source_statuses(now=now, readings=readings)
    destinations = destination_statuses(now=now, readings=readings)
    seen_at = readings.read(HEARTBEAT, [Heartbeat], heartbeat_seen_at, None)
    beat = BeatReading(
        seen_at=seen_at,
        stale_after=heartbeat_stale_after(),
        interval=heartbeat_interval(),
        read=not readings.failed(HEARTBEAT),
    )
    not_read: tuple[datetime | None, bool] = (None, False)
    relay_seen, needed = readings.read(
        RELAYS,
        [Heartbeat, WebhookDestination],
        lambda: (relays_seen_at(), relay_needed()),
        not_read,
    )
    relays = RelayReading(seen_at=relay_seen, needed=needed, read=not readings.failed(RELAYS))
    readings.locked_unread()
    broker_error = _broker_error(bound)
    system = _system_reasons(now, beat, relays, broker_error)
    verdict = status_verdict(sources, destinations, system=system, unread=readings.unread)
    unread = list(readings.unread)
    return Status(now, sources, destinations, beat, relays, broker_error, system, unread, verdict)


def _broker_error(bound: float) -> str | None:
    """Why Celery's broker did not answer within ``bound`` (/health/'s Broker check), or
    None."""
    try:
        Broker(timeout=timedelta(seconds=bound)).run()
    except ServiceUnavailable as exc:
        return str(exc.message)
    return None


def _system_reasons(
    now: datetime, beat: BeatReading, relays: RelayReading, broker_error: str | None
) -> tuple[Reason, ...]:
    found = []
    if broker_error is not None:
        found.append(
            Reason(
                "broker_unreachable",
                State.ALERT,
                f"broker unreachable: {broker_error}",
                f"Celery's broker does not answer ({broker_error}): until it does, no failed "
                "event is retried and no beat task runs (the outbox's relay does not need it)",
            )
        )
    age = beat.age(now)
    if beat.read and (age is None or age > beat.stale_after):
        every = "" if beat.interval is None else f", sent every {duration_text(beat.interval)}"
        limit = f"stale after {duration_text(beat.stale_after)}{every}"
        summary = "beat never seen" if age is None else f"beat not seen for {duration_text(age)}"
        found.append(
            Reason(
                "beat_not_seen",
                State.ALERT,
                summary,
                f"{summary}: no heartbeat recorded ({limit}); without beat and a worker "
                "running it, failed events are not retried, silence not noticed, old "
                "records not purged",
            )
        )
    relay_age = relays.age(now)
    if relays.read and relays.needed and (relay_age is None or relay_age > RELAY_STALE_AFTER):
        summary = (
            "no relay running: none ever seen"
            if relay_age is None
            else f"no relay running: none seen for {duration_text(relay_age)}"
        )
        found.append(
            Reason(
                "relay_not_running",
                State.ALERT,
                summary,
                f"{summary} (a relay records a heartbeat every "
                f"{duration_text(RELAY_STALE_AFTER / 3)}): nothing is sent to the "
                "destinations until one runs (manage.py webhook_relay)",
            )
        )
    return tuple(found)
