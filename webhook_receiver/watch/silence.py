"""Silence alerts: a source that normally sends events and goes quiet pages someone, once.

Silence means no *accepted* event (``status.last_accepted_at``), not no request: a
source whose every request is refused (a rotated secret, a clock off) is silent too,
and its alert counts the refusals by reason.

``check_silence`` runs every minute on beat, possibly on several workers at once. For
each source with SILENCE_AFTER_SECONDS:

- accepted events newer than the open alert's last one: the alert resolves, one
  recovery notice;
- an open alert and still silent: its counts and ``last_checked_at`` are refreshed,
  nothing is sent;
- no open alert, silent for longer than the window, inside the active hours: one alert
  opens, one notice.

A source that never accepted an event opens no alert unless requests for it are being
refused: a source configured ahead of its first delivery is not an incident. Outside
ACTIVE_HOURS no alert opens, and an alert opens only once the whole window lies inside
them (a source quiet overnight gets one window after opening time). An alert already
open stays open outside them: only accepted traffic ends a silence.

The database arbitrates between checkers: one unresolved alert per source (the partial
unique constraint ``webhook_silence_one_open``), and a resolution is an UPDATE guarded
by ``resolved_at IS NULL``. Only the checker whose write won sends the notice, after
its transaction committed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from ..conf.sources import SourceConfig
from ..inbound.models import RequestAudit, Verification
from ..sources.lookup import sources_all
from .models import SilenceAlert
from .notifiers import Notifier, get_notifiers
from .traffic import last_accepted_at, unrecorded_refusals

logger = logging.getLogger(__name__)

# what a check found for a source
RECEIVING = "receiving"  # accepted events within the window
NEVER_ACCEPTED = "never_accepted"  # no accepted event ever, and nothing refused
OUTSIDE_HOURS = "outside_active_hours"  # silent, but silence is expected now
OPENED = "opened"  # this check opened an alert
OPEN = "open"  # an alert was open already (or another checker opened it just now)
RESOLVED = "resolved"  # this check resolved the open alert


@dataclass(frozen=True)
class SilenceCheck:
    source: str
    state: str
    alert_id: int | None = None
    last_accepted_at: datetime | None = None
    rejected_total: int = 0


def check_silence(*, now: datetime | None = None) -> list[SilenceCheck]:
    """Check every source with SILENCE_AFTER_SECONDS, and every source with an open
    alert (so that an alert still resolves after its source's window was removed).

    ``now`` is injectable so that tests can travel in time. Raises
    ``ImproperlyConfigured`` for an unknown NOTIFIERS name before changing anything.
    """
    now = now or timezone.now()
    notifiers = get_notifiers()
    open_alerts = {a.source: a for a in SilenceAlert.objects.filter(resolved_at__isnull=True)}
    watched = {s.slug: s for s in sources_all().values() if s.silence_after}
    return [
        _check(slug, watched.get(slug), open_alerts.get(slug), now=now, notifiers=notifiers)
        for slug in sorted(watched.keys() | open_alerts.keys())
    ]


def _check(
    slug: str,
    source: SourceConfig | None,
    alert: SilenceAlert | None,
    *,
    now: datetime,
    notifiers: list[Notifier],
) -> SilenceCheck:
    last = last_accepted_at(slug)
    if alert is not None:
        if last is not None and (alert.last_accepted_at is None or last > alert.last_accepted_at):
            return _resolve(alert, last, now=now, notifiers=notifiers)
        return _refresh(alert, last, now=now)
    assert source is not None and source.silence_after is not None  # watched, see above
    after = source.silence_after
    if last is not None and now - last <= after:
        return SilenceCheck(slug, RECEIVING, last_accepted_at=last)
    rejected = rejected_counts(slug, since=_window_start(last, now, after), until=now)
    total = sum(rejected.values())
    if last is None and not total:
        return SilenceCheck(slug, NEVER_ACCEPTED)
    hours = source.active_hours
    if hours is not None and not (hours.contains(now) and hours.contains(now - after)):
        return SilenceCheck(slug, OUTSIDE_HOURS, last_accepted_at=last, rejected_total=total)
    return _open(slug, last, after, rejected, now=now, notifiers=notifiers)


def rejected_counts(source: str, *, since: datetime, until: datetime) -> dict[str, int]:
    """Requests for ``source`` refused in ``(since, until]``, per verification code:
    their audit records, and those beyond the audit bound that only their minute's
    tally counts. (Index ranges on received_at and on the tallies' minute: audit rows
    are many, but the window is short.)"""
    rows = (
        RequestAudit.objects.filter(source=source, received_at__gt=since, received_at__lte=until)
        .exclude(verification=Verification.VERIFIED)
        .values_list("verification")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = dict(rows)
    for reason, n in unrecorded_refusals(since=since, until=until, by=("reason",), source=source):
        counts[reason] = counts.get(reason, 0) + n
    return counts


def _window_start(last: datetime | None, now: datetime, after: timedelta) -> datetime:
    # the silent window: the last accepted event, or one window back, whichever is later
    return max(last, now - after) if last is not None else now - after


def _open(
    slug: str,
    last: datetime | None,
    after: timedelta,
    rejected: dict[str, int],
    *,
    now: datetime,
    notifiers: list[Notifier],
) -> SilenceCheck:
    total = sum(rejected.values())
    try:
        # a savepoint of its own: a concurrent checker's alert (webhook_silence_one_open)
        # makes this insert fail without spoiling a caller's transaction
        with transaction.atomic():
            alert = SilenceAlert.objects.create(
                source=slug,
                opened_at=now,
                last_accepted_at=last,
                silence_after_seconds=int(after.total_seconds()),
                rejected_counts=rejected,
                rejected_total=total,
                last_checked_at=now,
            )
            # the notice goes out once the alert is committed (never for a rolled-back
            # one); robust: whatever _notify lets escape is logged, not raised here
            transaction.on_commit(
                lambda: _notify(alert, "opened", now=now, notifiers=notifiers), robust=True
            )
    except IntegrityError:
        # another checker opened it first, and notifies
        return SilenceCheck(slug, OPEN, last_accepted_at=last, rejected_total=total)
    return SilenceCheck(slug, OPENED, alert.pk, last, total)


def _refresh(alert: SilenceAlert, last: datetime | None, *, now: datetime) -> SilenceCheck:
    after = timedelta(seconds=alert.silence_after_seconds)
    rejected = rejected_counts(alert.source, since=_window_start(last, now, after), until=now)
    total = sum(rejected.values())
    SilenceAlert.objects.filter(pk=alert.pk, resolved_at__isnull=True).update(
        last_checked_at=now, rejected_counts=rejected, rejected_total=total
    )
    return SilenceCheck(alert.source, OPEN, alert.pk, last, total)


def _resolve(
    alert: SilenceAlert, last: datetime, *, now: datetime, notifiers: list[Notifier]
) -> SilenceCheck:
    with transaction.atomic():
        # resolved_at IS NULL: of several checkers, the one whose update matched resolves
        # and sends the recovery notice; the others find nothing left to do
        won = SilenceAlert.objects.filter(pk=alert.pk, resolved_at__isnull=True).update(
            resolved_at=now, resolved_by_event_at=last, last_checked_at=now
        )
        if won:
            alert.resolved_at, alert.resolved_by_event_at, alert.last_checked_at = now, last, now
            transaction.on_commit(
                lambda: _notify(alert, "resolved", now=now, notifiers=notifiers), robust=True
            )
    state = RESOLVED if won else RECEIVING
    return SilenceCheck(alert.source, state, alert.pk, last, alert.rejected_total)


def _notify(alert: SilenceAlert, event: str, *, now: datetime, notifiers: list[Notifier]) -> None:
    """Tell every notifier; one that fails is logged and the others still hear of it.
    The notice counts as sent when at least one notifier took it."""
    sent = 0
    for notifier in notifiers:
        try:
            getattr(notifier, f"alert_{event}")(alert)
            sent += 1
        except Exception:
            logger.exception(
                "silence notifier %s failed on the %s alert #%s of %s",
                type(notifier).__name__,
                event,
                alert.pk,
                alert.source,
                extra={"webhook": {"source": alert.source, "silence_alert": alert.pk}},
            )
    if sent:
        field = "opened_notice_sent_at" if event == "opened" else "recovery_notice_sent_at"
        SilenceAlert.objects.filter(pk=alert.pk).update(**{field: now})
        setattr(alert, field, now)
