"""What the sources have been sending: the last accepted event, the refusals beyond the
audit bound, the activity series of the overview's chart, and the gaps between events
(to choose a silence window from).

Selectors only, each an index range however large the tables grow:

- ``last_accepted_at``: two index lookups per source, (source, received_at) on receipts
  and (source, first_attempt_at) on failed events; O(1).
- ``unrecorded_refusals``: a range of the rejection tallies' (minute, source, reason) key.
- ``observed_gaps``: one range of ``webhook_receipt_source_time``, capped at
  MAX_GAP_EVENTS rows; O(min(events in the days, cap)).
- ``activity_series``: one range of ``webhook_audit_received`` over the hours, grouped
  per minute in SQL and folded into buckets here; O(requests in the hours), plus the
  tallies' range. At high volume (millions of accepted requests a day) this is the
  costly read of the overview page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from ..inbound.models import FailedEvent, RejectionTally, RequestAudit, Verification, WebhookReceipt
from ..presentation.display import iso, seconds
from ..sources.lookup import sources_all

# observed_gaps reads at most this many receipts per source (the newest ones)
MAX_GAP_EVENTS = 10_000


# activity_series' key for requests to slugs that are not configured (any URL can make
# one, so they are summed rather than given a series each)
UNCONFIGURED = "(not configured)"


def unrecorded_refusals(
    *, since: datetime, until: datetime, by: tuple[str, ...], source: str | None = None
) -> list[tuple[Any, ...]]:
    """Refused requests with no audit record (beyond REJECTED_AUDIT_PER_MINUTE), summed
    by the tally's fields ``by`` (e.g. ("source", "reason")): rows of those fields and the
    count. They are what every count of refusals adds to the records it counts. Read from
    the tallies of minutes that start in [since, until] (of ``source`` alone, if given): a
    minute counts where it starts, so such a window is exact to the minute for a flood,
    and to the microsecond below it."""
    tallies = RejectionTally.objects.filter(minute__gte=since, minute__lte=until, unrecorded__gt=0)
    if source is not None:
        tallies = tallies.filter(source=source)
    return list(tallies.values(*by).annotate(n=Sum("unrecorded")).values_list(*by, "n").order_by())


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
            "p50_seconds": seconds(self.p50),
            "p99_seconds": seconds(self.p99),
            "max_seconds": seconds(self.max),
            "since": iso(self.since),
            "until": iso(self.until),
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
    config = sources_all().get(source)
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

    slugs = list(sources_all())
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
    tallies = unrecorded_refusals(since=start, until=now, by=("source", "minute"))
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
