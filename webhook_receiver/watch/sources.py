"""Selectors for watching the receiver: what each source has been doing, and whether a
person needs to look.

Every read here is an index range, so that silence checks, metrics scrapes, the
overview and ``manage.py webhook_status`` stay cheap however large the tables grow.
What each read costs (n: the rows in the range it reads):

- ``last_accepted_at``: two index lookups per source, (source, received_at) on receipts
  and (source, first_attempt_at) on failed events; O(1).
- requests in the last hour: one range of ``webhook_audit_received`` (received_at),
  grouped in SQL; O(requests in the hour), which the audit bound keeps at most
  REJECTED_AUDIT_PER_MINUTE × 60 refused ones per source and reason; and one range of
  the rejection tallies' (minute, source, reason) key for the refusals beyond it.
- retrying and dead counts, with the oldest and most overdue retry: one range of a
  status-first index (``webhook_failed_due``, ``webhook_failed_updated``) over the two
  statuses, grouped by source; O(retrying + dead).
- open silence alerts: the partial unique index ``webhook_silence_one_open`` holds
  exactly the open ones; O(sources).
- open repair items: the partial index ``webhook_repair_one_open`` (or
  ``webhook_repair_status``); O(open items).
- the last finished reconciliation run: NOT a pure range. ``webhook_reconcile_started``
  is read backwards until a run of the source turns up: O(runs of other sources since
  that one), which is small while every reconciled source runs on a schedule. An index
  on (source, started_at) would make it one lookup.
- ``observed_gaps``: one range of ``webhook_receipt_source_time``, capped at
  MAX_GAP_EVENTS rows; O(min(events in the days, cap)).
- ``activity_series``: one range of ``webhook_audit_received`` over the hours, grouped
  per minute in SQL and folded into buckets here; O(requests in the hours), plus the
  tallies' range. At high volume (millions of accepted requests a day) this is the
  costly read of the overview page.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any

from django.db.models import Count, Min, Q, QuerySet, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from ..conf import SourceConfig, app_settings, get_source
from ..inbound.models import (
    FailedEvent,
    FailureStatus,
    RejectionTally,
    RequestAudit,
    Verification,
    WebhookReceipt,
)
from ..reconcile.models import ReconciliationRun, RepairItem, RepairStatus, RunOutcome
from .models import SilenceAlert

# what "recent" means for requests and results
LAST_HOUR = timedelta(hours=1)
# a retrying event failing for longer than this is worth a look: its cause is not passing
OLD_RETRY = timedelta(hours=1)
# a retry due this long ago has not run: the sweeper (worker or beat) is not working
OVERDUE_RETRY = timedelta(minutes=10)
# observed_gaps reads at most this many receipts per source (the newest ones)
MAX_GAP_EVENTS = 10_000
# the rejection "reason" of a verified request that was neither applied nor captured (503)
NOT_STORED = "not_stored"
# activity_series' key for requests to slugs that are not configured (any URL can make
# one, so they are summed rather than given a series each)
UNCONFIGURED = "(not configured)"


def duration_text(delta: timedelta) -> str:
    """A duration as a person reads it at a glance: "45 s", "20 min", "2 h 05 min",
    "3 d 4 h"."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def unrecorded_refusals(*, since: datetime, until: datetime) -> QuerySet[RejectionTally]:
    """The rejection tallies of minutes that start in [since, until] and hold refused
    requests with no audit record (beyond REJECTED_AUDIT_PER_MINUTE): what every count
    of refusals adds to the records it counts. A minute counts where it starts, so such
    a window is exact to the minute for a flood, and to the microsecond below it."""
    return RejectionTally.objects.filter(minute__gte=since, minute__lte=until, unrecorded__gt=0)


def last_accepted_at(source: str) -> datetime | None:
    """When ``source`` last sent an event we accepted: a new event's receipt, or a
    verified event held as a failed event. (A redelivered duplicate is not news.)

    Two index lookups: receipts by (source, received_at), failed events by
    (source, first_attempt_at).
    """
    received = (
        WebhookReceipt.objects.filter(source=source)
        .order_by("-received_at")
        .values_list("received_at", flat=True)
        .first()
    )
    captured = (
        FailedEvent.objects.filter(source=source)
        .order_by("-first_attempt_at")
        .values_list("first_attempt_at", flat=True)
        .first()
    )
    moments = [m for m in (received, captured) if m is not None]
    return max(moments) if moments else None


# --- a source's state and why --------------------------------------------------------------


class State(IntEnum):
    """Ordered, so that a source's state is its worst condition's."""

    OK = 0
    ATTENTION = 1
    ALERT = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Reason:
    """One condition that makes a source not ok: a stable code, its level, a few words
    for the verdict ("silent for 42 min") and the sentence with the detail."""

    code: str
    state: State
    summary: str
    text: str

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "state": self.state.label,
            "summary": self.summary,
            "text": self.text,
        }


@dataclass(frozen=True)
class SourceStatus:
    source: str
    # False: no longer in the settings, but it still holds failed events, an open alert
    # or open repair items (verified records only: any URL can make a rejected request)
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
    silence_alert: SilenceAlert | None
    last_run: ReconciliationRun | None
    open_repairs: Mapping[str, int]
    reasons: tuple[Reason, ...] = field(default=())

    @property
    def state(self) -> State:
        return max((r.state for r in self.reasons), default=State.OK)

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
        """The stable machine shape (``webhook_status --json``; docs/overview.md)."""
        alert = self.silence_alert
        run = self.last_run
        return {
            "source": self.source,
            "configured": self.configured,
            "state": self.state.label,
            "reasons": [r.as_dict() for r in self.reasons],
            "last_accepted_at": _iso(self.last_accepted_at),
            "last_accepted_age_seconds": _seconds(self.last_accepted_age),
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
                "oldest_retry_at": _iso(self.oldest_retry_at),
                "oldest_retry_age_seconds": _seconds(self.oldest_retry_age),
                "retry_overdue_seconds": _seconds(self.retry_overdue),
            },
            "silence": {
                "after_seconds": _seconds(self.silence_after),
                "active_hours": self.active_hours,
                "in_active_hours": self.in_active_hours,
                "open_alert": None
                if alert is None
                else {
                    "opened_at": _iso(alert.opened_at),
                    "last_accepted_at": _iso(alert.last_accepted_at),
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
                    "started_at": _iso(run.started_at),
                    "finished_at": _iso(run.finished_at),
                    "counts": dict(sorted(run.counts.items())),
                    "error": run.error,
                },
                "open_repair_items": dict(sorted(self.open_repairs.items())),
            },
        }


@dataclass(frozen=True)
class Condition:
    code: str
    state: State
    # why this condition matters, in one line (docs/overview.md lists them)
    why: str
    # (summary, sentence) for this source, or None when the condition does not hold
    test: Callable[[SourceStatus], tuple[str, str] | None]


def _silent(s: SourceStatus) -> tuple[str, str] | None:
    alert = s.silence_alert
    if alert is None:
        return None
    if alert.last_accepted_at:
        silent_for = duration_text(s.now - alert.last_accepted_at)
        summary, since = f"silent for {silent_for}", f"no accepted event for {silent_for}"
    else:
        summary, since = "silent, never sent an event", "no accepted event ever"
    window = duration_text(timedelta(seconds=alert.silence_after_seconds))
    text = f"silent: {since} (window {window})"
    if alert.rejected_total:
        text += f", {alert.rejected_total} refused meanwhile ({_top(alert.rejected_counts)})"
    return summary, text


def _repair(s: SourceStatus) -> tuple[str, str] | None:
    n = s.open_repair_total
    if not n:
        return None
    summary = f"{n} open repair item{_s(n)}"
    return summary, f"{summary} ({_top(s.open_repairs)})"


def _dead(s: SourceStatus) -> tuple[str, str] | None:
    if not s.dead:
        return None
    text = f"{s.dead} dead letter{_s(s.dead)}"
    return text, text


def _old_retry(s: SourceStatus) -> tuple[str, str] | None:
    age = s.oldest_retry_age
    if age is None or age <= OLD_RETRY:
        return None
    return f"retrying for {duration_text(age)}", (
        f"an event has been retrying for {duration_text(age)}"
    )


def _overdue(s: SourceStatus) -> tuple[str, str] | None:
    late = s.retry_overdue
    if late is None or late <= OVERDUE_RETRY:
        return None
    return "retries not running", (
        f"retries are not running: one was due {duration_text(late)} ago"
    )


def _rejected(s: SourceStatus) -> tuple[str, str] | None:
    refused = {k: n for k, n in s.rejected_last_hour.items() if k != NOT_STORED}
    n = sum(refused.values())
    if not n:
        return None
    summary = f"{n} request{_s(n)} refused"
    text = f"{summary} in the last hour ({_top(refused)})"
    if s.unrecorded_last_hour:
        text += (
            f"; a flood: {s.unrecorded_last_hour} of them beyond "
            f"{app_settings().rejected_audit_per_minute} a minute per reason are counted, "
            "not recorded one by one"
        )
    return summary, text


def _not_stored(s: SourceStatus) -> tuple[str, str] | None:
    n = s.rejected_last_hour.get(NOT_STORED, 0)
    if not n:
        return None
    summary = f"{n} request{_s(n)} not stored (503)"
    return summary, f"{n} request{_s(n)} answered 503 (not stored) in the last hour"


def _reconcile_failed(s: SourceStatus) -> tuple[str, str] | None:
    if s.last_run is None or s.last_run.outcome != RunOutcome.FAILED:
        return None
    error = " ".join(s.last_run.error.split())
    summary = "reconciliation failed"
    return summary, "the last reconciliation failed" + (f": {error[:80]}" if error else "")


# The one rule for a source's state: the worst condition that holds, ALERT first. Each
# line: a stable code (in --json), the level, and why it is that level. "Needs repair"
# is read from the open repair items rather than the last run's outcome: an item
# resolved by hand no longer needs anything, although the run that found it said so.
CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "silent",
        State.ALERT,
        "an open silence alert: the source sent nothing we accepted for longer than its "
        "window, within its active hours",
        _silent,
    ),
    Condition(
        "repair_needed",
        State.ALERT,
        "open repair items: reconciliation found events the sender lists and we lack, or "
        "state that differs",
        _repair,
    ),
    Condition(
        "dead_letters",
        State.ATTENTION,
        "dead letters: verified events that will not be retried; a person replays or discards them",
        _dead,
    ),
    Condition(
        "old_retry",
        State.ATTENTION,
        f"an event retrying for over {duration_text(OLD_RETRY)}: its cause is not passing "
        "and it will soon be dead",
        _old_retry,
    ),
    Condition(
        "retries_stalled",
        State.ATTENTION,
        f"a retry due over {duration_text(OVERDUE_RETRY)} ago has not run: the worker or "
        "beat is down, and nothing is retried",
        _overdue,
    ),
    Condition(
        "not_stored",
        State.ATTENTION,
        "verified requests answered 503 in the last hour: neither applied nor captured "
        "(the database failing); the sender retries them",
        _not_stored,
    ),
    Condition(
        "rejected",
        State.ATTENTION,
        "requests refused in the last hour: a wrong secret, clock or URL at the sender, "
        "or someone else's requests",
        _rejected,
    ),
    Condition(
        "reconcile_failed",
        State.ATTENTION,
        "the last reconciliation run failed: differences with the sender go unseen",
        _reconcile_failed,
    ),
)


def status_reasons(status: SourceStatus) -> tuple[Reason, ...]:
    """Every condition that holds for ``status``, alerts first (CONDITIONS' order)."""
    found = ((c, c.test(status)) for c in CONDITIONS)
    return tuple(Reason(c.code, c.state, *words) for c, words in found if words is not None)


# --- the selectors --------------------------------------------------------------------------


def source_statuses(*, now: datetime | None = None) -> list[SourceStatus]:
    """One status per configured source (in the settings' order), then any source no
    longer configured that still holds retrying or dead events, an open silence alert
    or open repair items (by name).

    Sources that only received rejected requests get no row: any URL under the endpoint
    makes such a record (activity_series sums them under UNCONFIGURED).
    """
    now = now or timezone.now()
    configured = app_settings().sources

    accepted, rejected, unrecorded = _last_hour(now)
    failed = _failed_figures()
    alerts = {a.source: a for a in SilenceAlert.objects.filter(resolved_at__isnull=True)}
    repairs: dict[str, dict[str, int]] = defaultdict(dict)
    for source, kind, n in (
        RepairItem.objects.filter(status=RepairStatus.OPEN)
        .values("source", "kind")
        .annotate(n=Count("*"))
        .values_list("source", "kind", "n")
        .order_by()
    ):
        repairs[source][kind] = n

    held = set(failed) | set(alerts) | set(repairs)
    slugs = [*configured, *sorted(held - set(configured))]
    statuses = []
    for slug in slugs:
        config = configured.get(slug)
        figures = failed.get(slug, {})
        hours = config.active_hours if config else None
        status = SourceStatus(
            source=slug,
            configured=config is not None,
            now=now,
            silence_after=config.silence_after if config else None,
            active_hours=str(hours) if hours else None,
            in_active_hours=hours.contains(now) if hours else None,
            last_accepted_at=last_accepted_at(slug),
            accepted_last_hour=accepted.get(slug, {}),
            rejected_last_hour=rejected.get(slug, {}),
            unrecorded_last_hour=unrecorded.get(slug, 0),
            retrying=figures.get("retrying", 0),
            dead=figures.get("dead", 0),
            oldest_retry_at=figures.get("oldest_retry_at"),
            next_retry_due_at=figures.get("next_retry_due_at"),
            silence_alert=alerts.get(slug),
            last_run=_last_run(slug, config, reconciled=slug in repairs),
            open_repairs=repairs.get(slug, {}),
        )
        statuses.append(_with_reasons(status))
    return statuses


def _with_reasons(status: SourceStatus) -> SourceStatus:
    return replace(status, reasons=status_reasons(status))


def _last_hour(
    now: datetime,
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, int]]:
    """Requests per source in (now - 1 h, now]: accepted ones by result, refused ones by
    rejection code (503s as NOT_STORED), and how many refused ones have no record."""
    accepted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rejected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    unrecorded: dict[str, int] = defaultdict(int)
    since = now - LAST_HOUR
    tallies = (
        unrecorded_refusals(since=since, until=now)
        .values("source", "reason")
        .annotate(n=Sum("unrecorded"))
        .values_list("source", "reason", "n")
        .order_by()
    )
    for source, reason, n in tallies:
        rejected[source][reason] += n
        unrecorded[source] += n
    rows = (
        RequestAudit.objects.filter(received_at__gt=since, received_at__lte=now)
        .values("source", "verification", "result", "response_status")
        .annotate(n=Count("*"))
        .values_list("source", "verification", "result", "response_status", "n")
        .order_by()
    )
    for source, verification, result, response_status, n in rows:
        if verification != Verification.VERIFIED:
            rejected[source][verification] += n
        elif response_status >= 500:
            rejected[source][NOT_STORED] += n
        else:
            accepted[source][result or "unknown"] += n
    return (
        {s: dict(v) for s, v in accepted.items()},
        {s: dict(v) for s, v in rejected.items()},
        dict(unrecorded),
    )


def _failed_figures() -> dict[str, dict[str, Any]]:
    """Per source: retrying and dead counts, the oldest retry's first attempt and the
    earliest retry due. Ranges of the status-first indexes; O(retrying + dead)."""
    figures: dict[str, dict[str, Any]] = defaultdict(dict)
    rows = (
        FailedEvent.objects.filter(status__in=(FailureStatus.RETRYING, FailureStatus.DEAD))
        .values("source", "status")
        .annotate(n=Count("*"), first=Min("first_attempt_at"), due=Min("next_attempt_at"))
        .values_list("source", "status", "n", "first", "due")
        .order_by()
    )
    for source, status, n, first, due in rows:
        figures[source][status] = n
        if status == FailureStatus.RETRYING:
            figures[source]["oldest_retry_at"] = first
            figures[source]["next_retry_due_at"] = due
    return dict(figures)


def _last_run(
    slug: str, config: SourceConfig | None, *, reconciled: bool
) -> ReconciliationRun | None:
    """The last finished run (a running one has no outcome yet), for sources that are
    reconciled, or that still hold open repair items."""
    if not reconciled and (config is None or config.reconcile is None):
        return None
    return (
        ReconciliationRun.objects.filter(source=slug)
        .exclude(outcome=RunOutcome.RUNNING)
        .order_by("-started_at")
        .first()
    )


@dataclass(frozen=True)
class Verdict:
    """The one line at the top of the overview and of webhook_status."""

    state: State
    text: str


def status_verdict(statuses: Sequence[SourceStatus], destinations: Sequence[Any] = ()) -> Verdict:
    """ "All 3 sources OK", or the sources that are not, each with its first reason:
    "1 source needs attention: shop — 4 dead letters". The outbox's destinations
    (watch/destinations.py), when there are any, are judged alike after the sources."""
    named = [("source", s.source, s) for s in statuses]
    named += [("destination", d.name, d) for d in destinations]
    if not named:
        return Verdict(State.OK, "No sources configured")
    worst = max(item.state for _, _, item in named)
    if worst == State.OK:
        if not destinations:
            n = len(statuses)
            return Verdict(State.OK, f"All {n} source{_s(n)} OK" if n > 1 else "The source is OK")
        counted = [_count(len(statuses), "source"), _count(len(destinations), "destination")]
        return Verdict(State.OK, "All " + " and ".join(c for c in counted if c) + " OK")
    parts = []
    for level in (State.ALERT, State.ATTENTION):
        for kind in ("source", "destination"):
            hit = [(name, item) for k, name, item in named if k == kind and item.state == level]
            if not hit:
                continue
            n = len(hit)
            head = (
                f"{n} {kind}{_s(n)} in alert"
                if level == State.ALERT
                else f"{n} {kind}{' needs' if n == 1 else 's need'} attention"
            )
            parts.append(f"{head}: " + "; ".join(_one_line(name, item) for name, item in hit))
    return Verdict(worst, ". ".join(parts))


def _count(n: int, kind: str) -> str:
    return f"{n} {kind}{_s(n)}" if n else ""


def _one_line(name: str, status: Any) -> str:
    first, *rest = status.reasons
    more = f" (+{len(rest)} more)" if rest else ""
    return f"{name} — {first.summary}{more}"


# --- observed gaps: to choose a silence window from the traffic -----------------------------


@dataclass(frozen=True)
class GapStats:
    """The gaps between consecutive accepted events of a source (nearest-rank
    percentiles)."""

    count: int  # gaps, one fewer than the events read
    p50: timedelta
    p99: timedelta
    max: timedelta
    # the events read: the oldest and newest receipt time
    since: datetime
    until: datetime
    # True when MAX_GAP_EVENTS cut the days short: the figures cover since..until only
    truncated: bool
    # gaps longer than the configured silence window (None: silence alerts are off);
    # each would have opened an alert within active hours
    longer_than_window: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "p50_seconds": _seconds(self.p50),
            "p99_seconds": _seconds(self.p99),
            "max_seconds": _seconds(self.max),
            "since": _iso(self.since),
            "until": _iso(self.until),
            "truncated": self.truncated,
            "longer_than_window": self.longer_than_window,
        }


def observed_gaps(
    *, source: str, now: datetime | None = None, days: int = 7, limit: int = MAX_GAP_EVENTS
) -> GapStats | None:
    """Gaps between the source's consecutive receipts over the last ``days``; None with
    fewer than two receipts.

    The newest ``limit`` receipt times are read (one index range of (source,
    received_at), newest first) and the gaps computed here, the same on PostgreSQL and
    SQLite. A source busier than ``limit`` events in ``days`` is covered only back to
    ``since`` (``truncated``): its gaps are short anyway, and the cap bounds the read
    (at 10,000 rows, a few milliseconds) however busy it is.
    """
    now = now or timezone.now()
    moments = list(
        WebhookReceipt.objects.filter(
            source=source, received_at__gte=now - timedelta(days=days), received_at__lte=now
        )
        .order_by("-received_at")
        .values_list("received_at", flat=True)[: limit + 1]
    )
    truncated = len(moments) > limit
    moments = moments[:limit]
    if len(moments) < 2:
        return None
    moments.reverse()
    gaps = sorted(b - a for a, b in zip(moments, moments[1:], strict=False))
    config = get_source(source)
    window = config.silence_after if config else None
    return GapStats(
        count=len(gaps),
        p50=_nearest_rank(gaps, 0.50),
        p99=_nearest_rank(gaps, 0.99),
        max=gaps[-1],
        since=moments[0],
        until=moments[-1],
        truncated=truncated,
        longer_than_window=None if window is None else sum(1 for g in gaps if g > window),
    )


def _nearest_rank(ordered: Sequence[timedelta], q: float) -> timedelta:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# --- activity: accepted and rejected requests per bucket, for the overview's chart -----------


@dataclass(frozen=True)
class ActivityBucket:
    start: datetime
    accepted: int
    rejected: int


def activity_series(
    *, now: datetime | None = None, hours: int = 24, bucket_minutes: int = 5
) -> dict[str, list[ActivityBucket]]:
    """Per source, accepted (verified and stored) and rejected (refused, or 503)
    requests in buckets of ``bucket_minutes``, the last one holding ``now``.

    Buckets are aligned to multiples of ``bucket_minutes`` in UTC, so a reload shows the
    same bars. Every configured source has a series (zeros included); requests to
    slugs not configured are summed under UNCONFIGURED, when there are any. SQL groups
    per minute (at most 60 × hours rows per source), and the minutes are folded here.
    """
    if bucket_minutes < 1 or 60 * hours % bucket_minutes:
        raise ValueError("bucket_minutes must be a whole divisor of the hours' minutes")
    now = now or timezone.now()
    size = timedelta(minutes=bucket_minutes)
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    end = epoch + ((now - epoch) // size + 1) * size
    start = end - timedelta(hours=hours)
    count = hours * 60 // bucket_minutes

    slugs = list(app_settings().sources)
    accepted = {slug: [0] * count for slug in slugs}
    rejected = {slug: [0] * count for slug in slugs}
    stored = Q(verification=Verification.VERIFIED, response_status__lt=500)
    rows = (
        RequestAudit.objects.filter(received_at__gte=start, received_at__lte=now)
        .annotate(minute=TruncMinute("received_at", tzinfo=UTC))
        .values("source", "minute")
        .annotate(ok=Count("id", filter=stored), refused=Count("id", filter=~stored))
        .values_list("source", "minute", "ok", "refused")
        .order_by()
    )
    # refusals beyond the audit bound: counted per minute only (the slugs that are not
    # configured share the source "", which lands under UNCONFIGURED)
    tallies = (
        unrecorded_refusals(since=start, until=now)
        .values("source", "minute")
        .annotate(refused=Sum("unrecorded"))
        .values_list("source", "minute", "refused")
        .order_by()
    )
    counted = [*rows, *((source, minute, 0, n) for source, minute, n in tallies)]
    for source, minute, ok, refused in counted:
        key = source if source in accepted else UNCONFIGURED
        if key not in accepted:
            accepted[key], rejected[key] = [0] * count, [0] * count
        i = min(count - 1, max(0, int((minute - start) // size)))
        accepted[key][i] += ok
        rejected[key][i] += refused
    return {
        key: [
            ActivityBucket(start + i * size, accepted[key][i], rejected[key][i])
            for i in range(count)
        ]
        for key in accepted
    }


# --- small helpers -------------------------------------------------------------------------


def _age(now: datetime, moment: datetime | None) -> timedelta | None:
    return None if moment is None else now - moment


def _top(counts: Mapping[str, int], shown: int = 3) -> str:
    """'invalid_signature: 10, timestamp_out_of_tolerance: 2', largest first."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{code}: {n}" for code, n in ordered[:shown])
    return text + (", …" if len(ordered) > shown else "")


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else round(delta.total_seconds(), 3)
