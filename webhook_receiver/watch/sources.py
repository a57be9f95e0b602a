"""Each source's state and why: what it has been doing, and whether a person needs to
look (the overview's rows, ``manage.py webhook_status``, the verdict).

Every read is an index range, so that the overview and ``webhook_status`` stay cheap
however large the tables grow (what the traffic reads cost: watch/traffic.py):

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
- the last finished reconciliation run: one lookup of (source, started_at).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from django.db.models import Count, Min, Q
from django.utils import timezone

from ..conf import app_settings
from ..conf.sources import SourceConfig
from ..core.encryption import SecretsUnreadable
from ..exceptions import NotStored
from ..inbound.models import (
    FailedEvent,
    FailureStatus,
    RejectionTally,
    RequestAudit,
    Verification,
    WebhookReceipt,
)
from ..reconcile.models import ReconciliationRun, RepairItem, RepairStatus, RunOutcome
from ..sources.lookup import sources_all, sources_unreadable
from ..sources.models import WebhookSource
from .conditions import SOURCE_CONDITIONS, reasons
from .models import SilenceAlert
from .pickup import retry_pickup
from .readings import Readings, read_unbounded
from .statuses import (
    ALERTS,
    AUDIT,
    FAILED,
    RECEIPTS,
    REPAIRS,
    RUNS,
    SOURCE_RECORDS,
    SourceStatus,
)
from .traffic import last_accepted_at, unrecorded_refusals

# what "recent" means for requests and results
LAST_HOUR = timedelta(hours=1)
# the rejection "reason" of a verified request that was neither applied nor captured
# (503): the answer's own error code, as the metrics label it
NOT_STORED = NotStored.code

T = TypeVar("T")


def _sources() -> tuple[dict[str, SourceConfig], dict[str, SecretsUnreadable]]:
    """The sources, and the enabled records whose secrets cannot be read (one read)."""
    return sources_all(), sources_unreadable()


# --- the selector --------------------------------------------------------------------------


def source_statuses(
    *, now: datetime | None = None, readings: Readings | None = None
) -> list[SourceStatus]:
    """One status per source (the settings' in their order, then the enabled records),
    then any source no longer configured that still holds retrying or dead events, an
    open silence alert or open repair items (by name).

    Sources that only received rejected requests get no row: any URL under the endpoint
    makes such a record (activity_series sums them under UNCONFIGURED).

    With ``readings``, each part is read within its bound: a part that is not is left
    at its empty value, and named in the status's ``unread`` (and in ``readings``).
    Without, a database error raises.
    """
    now = now or timezone.now()
    read = readings.read if readings is not None else read_unbounded
    nothing_unreadable: dict[str, SecretsUnreadable] = {}
    configured, unreadable = read(
        SOURCE_RECORDS,
        [WebhookSource],
        _sources,
        (dict(app_settings().sources), nothing_unreadable),
    )
    nothing: LastHour = ({}, {}, {})
    last_hour = read(AUDIT, [RequestAudit, RejectionTally], partial(_last_hour, now), nothing)
    accepted, rejected, unrecorded = last_hour
    failed: dict[str, dict[str, Any]] = read(
        FAILED, [FailedEvent], partial(_failed_figures, now), {}
    )
    alerts: dict[str, SilenceAlert] = read(ALERTS, [SilenceAlert], _open_alerts, {})
    repairs: dict[str, dict[str, int]] = read(REPAIRS, [RepairItem], _open_repairs, {})

    held = set(failed) | set(alerts) | set(repairs)
    slugs = [*configured, *unreadable, *sorted(held - set(configured) - set(unreadable))]
    statuses = []
    for slug in slugs:
        config = configured.get(slug)
        figures = failed.get(slug, {})
        hours = config.active_hours if config else None
        status = SourceStatus(
            source=slug,
            configured=config is not None or slug in unreadable,
            secrets_unreadable=unreadable[slug].state if slug in unreadable else "",
            now=now,
            silence_after=config.silence_after if config else None,
            active_hours=str(hours) if hours else None,
            in_active_hours=hours.contains(now) if hours else None,
            last_accepted_at=read(
                RECEIPTS, [WebhookReceipt, FailedEvent], partial(last_accepted_at, slug), None
            ),
            accepted_last_hour=accepted.get(slug, {}),
            rejected_last_hour=rejected.get(slug, {}),
            unrecorded_last_hour=unrecorded.get(slug, 0),
            retrying=figures.get("retrying", 0),
            dead=figures.get("dead", 0),
            oldest_retry_at=figures.get("oldest_retry_at"),
            next_retry_due_at=figures.get("next_retry_due_at"),
            retry_pickup=retry_pickup(figures.get("due", 0)),
            silence_alert=alerts.get(slug),
            last_run=read(
                RUNS,
                [ReconciliationRun],
                partial(_last_run, slug, config, reconciled=slug in repairs),
                None,
            ),
            open_repairs=repairs.get(slug, {}),
            unread=()
            if readings is None
            else tuple(
                w
                for w in (SOURCE_RECORDS, AUDIT, RECEIPTS, FAILED, ALERTS, REPAIRS, RUNS)
                if readings.failed(w)
            ),
        )
        statuses.append(_with_reasons(status))
    return statuses


def _open_alerts() -> dict[str, SilenceAlert]:
    return {a.source: a for a in SilenceAlert.objects.filter(resolved_at__isnull=True)}


def _open_repairs() -> dict[str, dict[str, int]]:
    repairs: dict[str, dict[str, int]] = defaultdict(dict)
    for source, kind, n in (
        RepairItem.objects.filter(status=RepairStatus.OPEN)
        .values("source", "kind")
        .annotate(n=Count("*"))
        .values_list("source", "kind", "n")
        .order_by()
    ):
        repairs[source][kind] = n
    return dict(repairs)


def _with_reasons(status: SourceStatus) -> SourceStatus:
    return replace(status, reasons=reasons(SOURCE_CONDITIONS, status))


# accepted requests by source and result, refused ones by source and reason, and refused
# ones with no record of their own, by source
LastHour = tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, int]]


def _last_hour(now: datetime) -> LastHour:
    """Requests per source in (now - 1 h, now]: accepted ones by result, refused ones by
    rejection code (503s as NOT_STORED), and how many refused ones have no record."""
    accepted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rejected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    unrecorded: dict[str, int] = defaultdict(int)
    since = now - LAST_HOUR
    for source, reason, n in unrecorded_refusals(since=since, until=now, by=("source", "reason")):
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


def _failed_figures(now: datetime) -> dict[str, dict[str, Any]]:
    """Per source: retrying and dead counts, the oldest retry's first attempt, the
    earliest retry due and how many are due now. Ranges of the status-first indexes;
    O(retrying + dead)."""
    figures: dict[str, dict[str, Any]] = defaultdict(dict)
    rows = (
        FailedEvent.objects.filter(status__in=(FailureStatus.RETRYING, FailureStatus.DEAD))
        .values("source", "status")
        .annotate(
            n=Count("*"),
            first=Min("first_attempt_at"),
            due_at=Min("next_attempt_at"),
            due=Count("next_attempt_at", filter=Q(next_attempt_at__lte=now)),
        )
        .values_list("source", "status", "n", "first", "due_at", "due")
        .order_by()
    )
    for source, status, n, first, due_at, due in rows:
        figures[source][status] = n
        if status == FailureStatus.RETRYING:
            figures[source]["oldest_retry_at"] = first
            figures[source]["next_retry_due_at"] = due_at
            figures[source]["due"] = due
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
