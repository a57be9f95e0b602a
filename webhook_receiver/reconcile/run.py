"""Reconciliation: what a sender says it sent, against what we hold; a repair list.

``reconciliation_run`` compares one source over a closed window ``[since, until)``
(by default ``[now - LOOKBACK, now - GRACE)``, so that events still in flight are left
out), in both directions:

- ``missing``: the sender sent it; we hold neither a receipt nor a failed event;
- ``failed``: we hold it as a failed event still retrying, dead or discarded;
- ``unexpected``: we applied a key in the window that the sender does not list (the
  sender's side is read MARGIN wider, so that an event at the edge is no false alarm);
- ``state_mismatch``: a subject's latest state and version as the sender's events set
  them differ from ours. Business state is the host's: it is read and compared by the
  host's hook, STATE_COMPARISON (reconcile/states.py; the demo shop's is
  ``project.shop.reconcile``).

A sender is a peer: whatever its records hold (NUL, lone surrogates) is stored made
fit for its column (``storable``), and a run that fails records why in a form the
database takes, so that no run is left ``running`` by its own error.

It never changes business state. It records a ``ReconciliationRun`` and ``RepairItem``s:
one open item per (source, kind, key), updated by later runs, and resolved by the run
that finds it gone ("resolved: now consistent"). Pages are compared as they arrive,
with batched lookups; only the set of the sender's keys is kept, for the unexpected
check. One run per source at a time: the database refuses a second "running" row.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import schemes
from ..conf import app_settings, get_source
from ..conf.sources import ReconcileConfig, SourceConfig
from ..core import storable
from ..inbound import queries
from ..inbound.handlers import subject_of
from ..inbound.models import FailedEvent, WebhookReceipt
from .adapters import SenderEvent, get_adapter
from .models import ReconciliationRun, RepairItem, RepairKind, RepairStatus, RunOutcome
from .states import StateComparison, SubjectState, state_comparison

logger = logging.getLogger(__name__)

LOOKUP_BATCH = 500  # keys per IN (...): under SQLite's parameter limit too
RESOLVED_NOTE = "resolved: now consistent"


class RunInProgress(Exception):
    """Another run of this source is under way."""


@dataclass
class _Findings:
    run: ReconciliationRun
    counts: Counter[str] = field(default_factory=Counter)
    sender_keys: set[str] = field(default_factory=set)
    states: dict[str, SubjectState] = field(default_factory=dict)
    comparison: StateComparison | None = None
    records: int = 0


def reconciliation_run(
    *,
    source_slug: str,
    now: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> ReconciliationRun:
    """Compare one source over a window; record the run and its repair items.

    Raises ``RunInProgress`` when another run of the source is under way, and
    ``LookupError`` when the source has no RECONCILE block. Any failure of the run
    itself (the sender unreachable, garbage, a bug) ends as a run with outcome
    ``failed`` and its error, logged at ERROR, with no items.
    """
    source = get_source(source_slug)
    if source is None or source.reconcile is None:
        raise LookupError(f"source {source_slug!r} has no RECONCILE block")
    config = source.reconcile
    now = now or timezone.now()
    since = since or now - config.lookback
    until = until or now - config.grace
    run = _run_start(source.slug, since=since, until=until, now=now)
    findings = _Findings(run=run)
    # inside a caller's transaction, a savepoint: a statement that fails must not leave
    # the run's own record unwritable. (Never a transaction of its own: none may stay
    # open across the sender's requests.)
    guard = transaction.atomic() if connection.in_atomic_block else nullcontext()
    try:
        with guard:
            findings.comparison = state_comparison(app_settings().state_comparison)
            _compare_sender_events(source, config, findings)
            _find_unexpected(source, findings)
            _compare_states(source, findings)
            resolved = _resolve_the_rest(findings)
            run.finished_at = timezone.now()
            run.sender_records = findings.records
            run.counts = {**dict(findings.counts), "resolved": resolved}
            run.outcome = (
                RunOutcome.NEEDS_REPAIR if sum(findings.counts.values()) else RunOutcome.OK
            )
            run.save()
    except Exception as exc:  # the run failed, not the events: record why
        return _run_failed(run, exc)
    return run


def _run_start(slug: str, *, since: datetime, until: datetime, now: datetime) -> ReconciliationRun:
    timeout = app_settings().reconcile_run_timeout
    with transaction.atomic():
        # a run still "running" this long after its start was abandoned (a killed worker)
        ReconciliationRun.objects.filter(
            source=slug, outcome=RunOutcome.RUNNING, started_at__lt=now - timeout
        ).update(
            outcome=RunOutcome.FAILED,
            finished_at=now,
            error=f"abandoned: still running after {timeout}",
        )
    try:
        with transaction.atomic():
            return ReconciliationRun.objects.create(
                source=slug,
                window_start=since,
                window_end=until,
                started_at=now,
                outcome=RunOutcome.RUNNING,
            )
    except IntegrityError as exc:  # webhook_reconcile_one_running
        raise RunInProgress(f"a reconciliation of {slug!r} is running") from exc


def _run_failed(run: ReconciliationRun, exc: BaseException) -> ReconciliationRun:
    """Record the failed run, with its error as a text column takes it. If even that is
    refused (the database failing), the run's row is closed without the error's text;
    failing that too, it is left to RECONCILE_RUN_TIMEOUT_SECONDS, and logged."""
    run.outcome = RunOutcome.FAILED
    run.finished_at = timezone.now()
    run.error = storable.text(_error_text(exc), 2000)
    fields = ["outcome", "finished_at", "error"]
    try:
        run.save(update_fields=fields)
    except DatabaseError:
        run.error = f"{type(exc).__name__} (its message could not be stored)"
        try:
            run.save(update_fields=fields)
        except DatabaseError:
            logger.exception("reconciliation run %s of %s not closed", run.pk, run.source)
    logger.error(
        "reconciliation of %s failed: %s",
        run.source,
        storable.text(run.error, 500),
        extra={"webhook": {"source": run.source, "run": run.pk}},
    )
    return run


def _error_text(exc: BaseException) -> str:
    """A run's error as stored: the class and message. A database error keeps its first
    line only: PostgreSQL's DETAIL and CONTEXT lines quote the record's data."""
    message = str(exc)
    if isinstance(exc, DatabaseError):
        message = message.splitlines()[0] if message else ""
    return f"{type(exc).__name__}: {message}"


def event_key_of(source: SourceConfig, event: SenderEvent) -> str:
    """The key our receive path derives for this event, from what the sender lists."""
    payload = dict(event.payload or {"id": event.id, "type": event.type, "data": event.data})
    message = schemes.VerifiedMessage(scheme=source.scheme, message_id=event.id, timestamp=None)
    if source.event_key:
        key = import_string(source.event_key)(payload=payload, message=message)
    else:
        key = schemes.get_scheme(source.scheme).default_key(payload=payload, message=message)
    return storable.key(str(key or event.id))


def _compare_sender_events(
    source: SourceConfig, config: ReconcileConfig, findings: _Findings
) -> None:
    run = findings.run
    since, until = run.window_start, run.window_end
    adapter = get_adapter(config.adapter)
    pages = adapter(
        options=config.options, since=since - config.margin, until=until + config.margin
    )
    for page in pages:
        keyed = {event_key_of(source, event): event for event in page}
        findings.sender_keys.update(keyed)
        in_window = {k: e for k, e in keyed.items() if since <= e.created_at < until}
        findings.records += len(in_window)
        for keys in _batches(list(in_window)):
            applied = set(
                WebhookReceipt.objects.filter(source=source.slug, event_key__in=keys).values_list(
                    "event_key", flat=True
                )
            )
            failed = dict(
                FailedEvent.objects.filter(
                    source=source.slug, event_key__in=keys, status__in=queries.OPEN
                ).values_list("event_key", "status")
            )
            for key in keys:
                if key in applied:
                    continue
                event = in_window[key]
                kind = RepairKind.FAILED if key in failed else RepairKind.MISSING
                we_hold = {"failed_event": failed[key]} if key in failed else {}
                _item(findings, kind, key, event=event, we_hold=we_hold)
        for key, event in in_window.items():
            _track_state(findings, key, event)


def _track_state(findings: _Findings, key: str, event: SenderEvent) -> None:
    """Keep the latest (highest version) state the sender's events set per subject, as
    the host's StateComparison reads them."""
    if findings.comparison is None:
        return
    found = findings.comparison.state_of(event)
    if found is None:
        return
    # as the host's query can take it (no NUL): such a subject cannot be one it holds
    subject = storable.text(found.subject, len(found.subject) * 6)
    known = findings.states.get(subject)
    if known is None or found.version > known.version:
        findings.states[subject] = replace(
            found,
            subject=subject,
            event_key=key,
            event_type=event.type,
            created_at=event.created_at,
        )


def _find_unexpected(source: SourceConfig, findings: _Findings) -> None:
    run = findings.run
    receipts = (
        WebhookReceipt.objects.filter(
            source=source.slug, received_at__gte=run.window_start, received_at__lt=run.window_end
        )
        .order_by()
        .values_list("event_key", "event_type", "received_at", "status")
        .iterator(chunk_size=2000)
    )
    for key, event_type, received_at, status in receipts:
        if key not in findings.sender_keys:
            we_hold = {"receipt": status, "received_at": received_at.isoformat()}
            _item(
                findings,
                RepairKind.UNEXPECTED,
                key,
                event_type=event_type,
                occurred_at=received_at,
                we_hold=we_hold,
            )


def _compare_states(source: SourceConfig, findings: _Findings) -> None:
    comparison = findings.comparison
    if comparison is None or not findings.states:
        return
    states = list(findings.states.values())
    for start in range(0, len(states), LOOKUP_BATCH):
        batch = {s.subject: s for s in states[start : start + LOOKUP_BATCH]}
        for mismatch in comparison.compare(source=source.slug, states=batch):
            sender = batch[mismatch.subject]
            _item(
                findings,
                RepairKind.STATE_MISMATCH,
                f"state:{mismatch.subject}",
                subject=mismatch.subject,
                event_type=sender.event_type,
                occurred_at=sender.created_at,
                sender_says=dict(mismatch.sender_says),
                we_hold=dict(mismatch.we_hold),
            )


def _item(
    findings: _Findings,
    kind: RepairKind,
    key: str,
    *,
    event: SenderEvent | None = None,
    event_type: str = "",
    subject: str = "",
    occurred_at: datetime | None = None,
    sender_says: Mapping[str, Any] | None = None,
    we_hold: Mapping[str, Any],
) -> None:
    """Open the item, or update the open one for the same (source, kind, key)."""
    run, now = findings.run, timezone.now()
    if event is not None:
        sender_says = {
            "id": event.id,
            "type": event.type,
            "created_at": event.created_at.isoformat(),
        }
        sender_says["data"] = dict(event.data)
        event_type = event_type or event.type
        occurred_at = event.created_at
        subject = subject or subject_of(event.data)
    values = {
        "subject": storable.text(subject, 255),
        "event_type": storable.text(event_type, 255),
        "occurred_at": occurred_at,
        # what a sender (or the host, of it) says, as jsonb takes it
        "sender_says": storable.json_value(sender_says or {}),
        "we_hold": storable.json_value(dict(we_hold)),
        "last_run": run,
        "updated_at": now,
    }
    open_item = RepairItem.objects.filter(
        source=run.source, kind=kind, event_key=key, status=RepairStatus.OPEN
    )
    if not open_item.update(**values):
        RepairItem.objects.create(
            source=run.source,
            kind=kind,
            event_key=key,
            status=RepairStatus.OPEN,
            first_run=run,
            created_at=now,
            **values,
        )
    findings.counts[kind.value] += 1


def _resolve_the_rest(findings: _Findings) -> int:
    """Open items of this window that this run did not find again are fixed now."""
    run = findings.run
    return (
        RepairItem.objects.filter(
            source=run.source,
            status=RepairStatus.OPEN,
            occurred_at__gte=run.window_start,
            occurred_at__lt=run.window_end,
        )
        .exclude(last_run=run)
        .update(
            status=RepairStatus.RESOLVED,
            resolved_by="reconciliation",
            resolved_at=timezone.now(),
            resolution_note=RESOLVED_NOTE,
            updated_at=timezone.now(),
        )
    )


def _batches(keys: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(keys), LOOKUP_BATCH):
        yield keys[start : start + LOOKUP_BATCH]


def sources_to_reconcile() -> list[str]:
    return [slug for slug, source in app_settings().sources.items() if source.reconcile]


def reconcile_sources() -> dict[str, str]:
    """Reconcile every source that has a RECONCILE block (the beat task's service): each
    source's outcome, or that another worker is running it."""
    outcomes = {}
    for slug in sources_to_reconcile():
        try:
            outcomes[slug] = reconciliation_run(source_slug=slug).outcome
        except RunInProgress:
            outcomes[slug] = "skipped: running elsewhere"
    return outcomes
