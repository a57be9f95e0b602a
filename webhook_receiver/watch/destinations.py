"""Each destination's state and why, for the overview and ``manage.py webhook_status``:
the same levels and reasons as the sources' (watch/sources.py).

One grouped query for every destination (``destinations_with_health``: only pending,
sending and failed messages are read, through the (destination, status, id) index), and
one more when failed messages hold back later ones of their ordering key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from ..core import storable
from ..core.states import Reason, State, worst_state
from ..core.words import duration_text, iso, plural
from ..outbound.breaker import Breaker, destination_breaker
from ..outbound.models import WebhookDestination
from ..outbound.selectors import destinations_with_health, failed_holding_back

# a message due this long ago and still not sent: the relay is behind, or not running
OLD_BACKLOG = timedelta(minutes=10)


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
    # the last answer of either kind: the relay is sending at all
    last_success_at: datetime | None
    last_failure_at: datetime | None
    # pending messages behind a failed one of their ordering key; the failed messages
    # holding them back, and the oldest of those (its id, key and ordering key)
    held_back: int = 0
    holding_back: int = 0
    first_holder: tuple[int, str, str] | None = None
    # the last round of answers the relay could not record, and why
    record_failed_at: datetime | None = None
    record_error: str = ""
    reasons: tuple[Reason, ...] = field(default=())

    @property
    def state(self) -> State:
        return worst_state(self.reasons)

    @property
    def oldest_eligible_age(self) -> timedelta | None:
        at = self.oldest_eligible_at
        return None if at is None else self.now - at

    @property
    def last_attempt_at(self) -> datetime | None:
        moments = [m for m in (self.last_success_at, self.last_failure_at) if m is not None]
        return max(moments) if moments else None

    @property
    def record_failing(self) -> bool:
        """The relay's last round could not be recorded, recently, and no answer has
        been recorded since."""
        at, last = self.record_failed_at, self.last_attempt_at
        return at is not None and self.now - at <= OLD_BACKLOG and (last is None or at > last)

    def as_dict(self) -> dict[str, Any]:
        """The stable machine shape (``webhook_status --json``; docs/overview.md)."""
        age = self.oldest_eligible_age
        return {
            "destination": self.name,
            "enabled": self.enabled,
            "state": self.state.label,
            "reasons": [r.as_dict() for r in self.reasons],
            "backlog": self.backlog,
            "failed": self.failed,
            "held_back": self.held_back,
            "oldest_eligible_age_seconds": None if age is None else age.total_seconds(),
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


def _breaker_open(d: DestinationStatus) -> tuple[str, str] | None:
    if d.breaker.state != "open" or d.breaker.until is None:
        return None
    left = duration_text(d.breaker.until - d.now)
    return "breaker open", (
        f"paused after {d.breaker.consecutive_failures} consecutive failures; one probe in {left}"
    )


def _failed(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.failed:
        return None
    summary = f"{d.failed} message{plural(d.failed)} failed"
    return summary, f"{summary} for good, waiting for Retry now or Discard"


def _held_back(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.held_back or d.first_holder is None:
        return None
    key, ordering_key = (storable.text(value, 255) for value in d.first_holder[1:])
    behind = f"{d.held_back} later message{plural(d.held_back)}"
    if d.holding_back == 1:
        text = f"failed message {key} holds back {behind} of its ordering key {ordering_key}"
    else:
        text = (
            f"{d.holding_back} failed messages hold back {behind} of their ordering keys "
            f"(the oldest: {key}, ordering key {ordering_key})"
        )
    return f"holding back {d.held_back}", f"{text}: Retry now or Discard it to let them go"


def _record_failing(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.record_failing:
        return None
    return "answers not recorded", (
        f"the relay could not record its answers: {d.record_error} (each is sent again, "
        "under its key, when its lease runs out, and counted against its budget)"
    )


def _stalled(d: DestinationStatus) -> tuple[str, str] | None:
    age = d.oldest_eligible_age
    if not d.enabled or d.breaker.state == "open" or age is None or age <= OLD_BACKLOG:
        return None
    if d.record_failing:  # it is sending: _record_failing names the cause
        return None
    last = d.last_attempt_at
    if last is not None and d.now - last <= OLD_BACKLOG:
        return None
    since = "never" if last is None else f"not for {duration_text(d.now - last)}"
    return "relay not sending", (
        f"messages are due and nothing is sent ({since}): the worker or the sweep is down"
    )


def _behind(d: DestinationStatus) -> tuple[str, str] | None:
    age = d.oldest_eligible_age
    if age is None or age <= OLD_BACKLOG or _stalled(d) or d.breaker.state == "open":
        return None
    return f"behind by {duration_text(age)}", (
        f"the oldest message due has waited {duration_text(age)} ({d.backlog} in the "
        "backlog): its limits are too low for the traffic, or it answers slowly"
    )


def _disabled(d: DestinationStatus) -> tuple[str, str] | None:
    if d.enabled or not d.backlog:
        return None
    summary = f"disabled, {d.backlog} waiting"
    return summary, f"disabled with {d.backlog} message{plural(d.backlog)} waiting to be sent"


# (code, level, why: docs/overview.md lists them, test). Every one is ATTENTION: a
# destination is someone else's endpoint, and nothing is lost while messages wait.
DESTINATION_CONDITIONS = (
    (
        "breaker_open",
        State.ATTENTION,
        "the destination failed too often in a row and is paused until one probe succeeds",
        _breaker_open,
    ),
    (
        "messages_failed",
        State.ATTENTION,
        "terminal messages (4xx, or attempts spent): an operator retries or discards them",
        _failed,
    ),
    (
        "held_back",
        State.ATTENTION,
        "a failed message holds back the later messages of its ordering key, which are "
        "delivered in order: retry or discard it",
        _held_back,
    ),
    (
        "record_failing",
        State.ATTENTION,
        "the relay sends, but the database refused to record the answers: they are sent "
        "again when their leases end",
        _record_failing,
    ),
    (
        "relay_not_sending",
        State.ATTENTION,
        f"messages due for over {duration_text(OLD_BACKLOG)} and no answer for as long: "
        "the worker or beat is down",
        _stalled,
    ),
    (
        "behind",
        State.ATTENTION,
        f"the oldest message due has waited over {duration_text(OLD_BACKLOG)} while "
        "others are sent: the limits are too low for the traffic",
        _behind,
    ),
    (
        "disabled_with_backlog",
        State.ATTENTION,
        "a disabled destination with messages waiting: enable it, or discard them",
        _disabled,
    ),
)


def destination_statuses(*, now: datetime | None = None) -> list[DestinationStatus]:
    """One status per destination, by name."""
    now = now or timezone.now()
    # no secrets: they are decrypted as they are read, and a status needs none of them
    # (nor, when the key is wrong, to fail for want of it)
    every = WebhookDestination.objects.order_by("name").defer("secrets")
    rows = list(destinations_with_health(every, now=now))
    holders = failed_holding_back(d.pk for d in rows if d.held_back)
    statuses = []
    for dest in rows:
        holding_back, first = holders.get(dest.pk, (0, None))
        status = DestinationStatus(
            name=dest.name,
            pk=dest.pk,
            enabled=dest.enabled,
            now=now,
            backlog=dest.backlog,
            failed=dest.failed_count,
            oldest_eligible_at=dest.oldest_eligible_at,
            breaker=destination_breaker(dest, now=now),
            last_success_at=dest.last_success_at,
            last_failure_at=dest.last_failure_at,
            held_back=dest.held_back,
            holding_back=holding_back,
            first_holder=None if first is None else (first.pk, first.key, first.ordering_key),
            record_failed_at=dest.record_failed_at,
            record_error=dest.record_error,
        )
        reasons = tuple(
            Reason(code, state, *words)
            for code, state, _why, test in DESTINATION_CONDITIONS
            if (words := test(status)) is not None
        )
        statuses.append(replace(status, reasons=reasons))
    return statuses
