"""What a source's and a destination's status hold, and how each reads as the stable
machine shape (``webhook_status --json``; docs/watching.md). The selectors that fill them
are watch/sources.py and watch/destinations.py; what makes one not OK is
watch/conditions.py, which reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..core.states import Reason, State, worst_state
from ..outbound.breaker import Breaker
from ..presentation.display import iso, seconds
from ..reconcile.models import ReconciliationRun
from .models import SilenceAlert

# the relay's last round that could not be recorded is named for this long (unless an
# answer was recorded since)
RECORD_FAILURE_SHOWN = timedelta(minutes=10)

# the readings a source's status is made of (watch/readings.py), each named as unread
# by what it is, and the JSON keys an unread one leaves null
AUDIT, RECEIPTS, FAILED = "request audit", "receipts", "failed events"
ALERTS, REPAIRS, RUNS = "silence alerts", "repair items", "reconciliation runs"
SOURCE_RECORDS = "source records"


# --- a source's state and why --------------------------------------------------------------


@dataclass(frozen=True)
class SourceStatus:
    source: str
    # False: no longer a source (of the settings, or an enabled record), but it still
    # holds failed events, an open alert or open repair items (verified records only:
    # any URL can make a rejected request)
    configured: bool
    now: datetime
    silence_after: timedelta | None
    active_hours: str | None
    # None when no active hours are set (always active)
    in_active_hours: bool | None
    last_accepted_at: datetime | None
    # verified requests in the last hour by result (applied, duplicate, deferred, …)
    accepted_last_hour: Mapping[str, int]
    # refused requests in the last hour by rejection code, and NOT_STORED for 503s
    rejected_last_hour: Mapping[str, int]
    # of those, how many have no audit record of their own: beyond the audit bound,
    # counted in the rejection tallies only (a flood)
    unrecorded_last_hour: int
    retrying: int
    dead: int
    # the retrying event that has failed longest: its first attempt
    oldest_retry_at: datetime | None
    # the retrying event due earliest: when it was due
    next_retry_due_at: datetime | None
    # how long a running retry sweep leaves a retry overdue, with as many due as now
    # (watch/pickup.py)
    retry_pickup: timedelta
    silence_alert: SilenceAlert | None
    last_run: ReconciliationRun | None
    open_repairs: Mapping[str, int]
    reasons: tuple[Reason, ...] = field(default=())
    # the parts not read within their bound (AUDIT, RECEIPTS, …): their figures are
    # empty here, and null in as_dict
    unread: tuple[str, ...] = ()
    # an enabled record whose secrets no key set reads: why, in a few words
    secrets_unreadable: str = ""

    @property
    def state(self) -> State:
        return worst_state(self.reasons)

    @property
    def last_accepted_age(self) -> timedelta | None:
        return _age(self.now, self.last_accepted_at)

    @property
    def oldest_retry_age(self) -> timedelta | None:
        return _age(self.now, self.oldest_retry_at)

    @property
    def retry_overdue(self) -> timedelta | None:
        due = _age(self.now, self.next_retry_due_at)
        return due if due is not None and due > timedelta(0) else None

    @property
    def accepted_total(self) -> int:
        return sum(self.accepted_last_hour.values())

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected_last_hour.values())

    @property
    def requests_last_hour(self) -> int:
        return self.accepted_total + self.rejected_total

    @property
    def open_repair_total(self) -> int:
        return sum(self.open_repairs.values())

    def as_dict(self) -> dict[str, Any]:
        """The stable machine shape (``webhook_status --json``; docs/watching.md)."""
        alert = self.silence_alert
        run = self.last_run
        document = {
            "source": self.source,
            "configured": self.configured,
            "secrets_unreadable": self.secrets_unreadable or None,
            "state": self.state.label,
            "reasons": [r.as_dict() for r in self.reasons],
            "last_accepted_at": iso(self.last_accepted_at),
            "last_accepted_age_seconds": seconds(self.last_accepted_age),
            "last_hour": {
                "requests": self.requests_last_hour,
                "accepted": self.accepted_total,
                "rejected": self.rejected_total,
                "accepted_by_result": dict(sorted(self.accepted_last_hour.items())),
                "rejected_by_reason": dict(sorted(self.rejected_last_hour.items())),
                "rejected_unrecorded": self.unrecorded_last_hour,
            },
            "failed_events": {
                "retrying": self.retrying,
                "dead": self.dead,
                "oldest_retry_at": iso(self.oldest_retry_at),
                "oldest_retry_age_seconds": seconds(self.oldest_retry_age),
                "retry_overdue_seconds": seconds(self.retry_overdue),
                "retry_pickup_seconds": seconds(self.retry_pickup),
            },
            "silence": {
                "after_seconds": seconds(self.silence_after),
                "active_hours": self.active_hours,
                "in_active_hours": self.in_active_hours,
                "open_alert": None
                if alert is None
                else {
                    "opened_at": iso(alert.opened_at),
                    "last_accepted_at": iso(alert.last_accepted_at),
                    "rejected_total": alert.rejected_total,
                    "rejected_counts": dict(sorted(alert.rejected_counts.items())),
                },
            },
            "reconciliation": {
                "last_run": None
                if run is None
                else {
                    "id": run.pk,
                    "outcome": run.outcome,
                    "started_at": iso(run.started_at),
                    "finished_at": iso(run.finished_at),
                    "counts": dict(sorted(run.counts.items())),
                    "error": run.error,
                },
                "open_repair_items": dict(sorted(self.open_repairs.items())),
            },
            "unread": list(self.unread),
        }
        return _unread_nulled(document, self.unread)


def _unread_nulled(document: dict[str, Any], unread: tuple[str, ...]) -> dict[str, Any]:
    """``document`` with the figures of each unread part null: an empty figure would
    read as "none" when it is "not known"."""
    if RECEIPTS in unread:
        document["last_accepted_at"] = document["last_accepted_age_seconds"] = None
    if AUDIT in unread:
        document["last_hour"] = None
    if FAILED in unread:
        document["failed_events"] = None
    if ALERTS in unread:
        document["silence"]["open_alert"] = None
    if RUNS in unread:
        document["reconciliation"]["last_run"] = None
    if REPAIRS in unread:
        document["reconciliation"]["open_repair_items"] = None
    return document


def _age(now: datetime, moment: datetime | None) -> timedelta | None:
    return None if moment is None else now - moment


# --- a destination's state and why ---------------------------------------------------------


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
    # why no configured key decrypts its secrets (core/encryption.py), or ""
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
