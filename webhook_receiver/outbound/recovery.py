"""Recovery jobs: one model (models.RecoveryJob) and one service for every way a
destination gets back what it missed.

- **recover** its failed messages (a merchant fixed its endpoint): each is sent again
  under its own key, with the whole retry policy (its failures back to 0); an open
  breaker is ended as the job starts;
- **missing**: the events a newly subscribed or re-enabled destination never had. The
  outbox keeps messages, not events: an event is found in what its tenant's other
  destinations were sent (the first of them, by id), and a message is written for this
  destination under the event's key, as admission would write it now (its filter
  applies; its subscriptions choose the types). An event that no destination of the
  tenant was sent was never written, and nothing brings it back;
- **replay** its delivered messages, under their own keys (the receiving end
  deduplicates them).

Every kind selects by when the message was admitted, ``since`` (required) to ``until``
(optional), and by event types (names or ``group.*``), answer classes (the last
answer: ``2xx`` … ``5xx``, or ``none`` for no answer) and an ordering key prefix.
Nothing older than the destination's replay horizon (``replay_horizon_days``: how long
its receiving end remembers a key) is sent again: such a job is refused, and says so.

**Plan, then run.** ``recovery_plan`` counts and samples what a job would send, without
writing; ``recovery_start`` counts again, and records the count and the highest message
id there is (``max_id``) with the job. The run selects with the same query, bounded by
that id, so it releases what the plan counted, no more. It runs in steps (one short
transaction each, which the relay process takes every second), each releasing the next
messages in id order (so each ordering key's in order: the relay sends a key's messages
oldest first) at the job's ``rate``, below the destination's, while fewer than two
seconds of them wait to be sent, and not while the destination's other waiting messages
grow (its messages are older than live traffic's, so the relay would send them first).
The later messages of a key that a recovered one held back go as it is delivered, older
than live traffic too: they are the key's, and its order comes first. A step moves
``last_id`` in the transaction that releases, so a process killed between steps resumes
where the last commit left it, and releases nothing twice (recovery_run.py).
``recovery_cancel`` stops a job; what it released is sent (discard it to stop that
too). One job runs for a destination at a time.

Every service takes a ``scope`` (tenancy.py); every job keeps who started it, what it
asked, how many it planned and released, and who cancelled it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from .breaker import destination_breaker
from .catalog import in_group, subscribed
from .models import (
    MessageStatus,
    OutboxMessage,
    RecoveryJob,
    RecoveryKind,
    RecoveryState,
    WebhookDestination,
)
from .relay.wakeups import relay_wake_on_commit
from .tenancy import Scope

logger = logging.getLogger(__name__)

# the messages a plan shows
SAMPLE_SIZE = 5
# a job's rate, when none is asked: this share of the destination's
DEFAULT_RATE_SHARE = 0.5
# the slowest a job goes (one message in about 17 minutes): slower, its plan's duration
# is past any date, and it would never end
MIN_RATE = 0.001
ANSWER_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")
# what each kind selects among the destination's messages (missing: among its siblings')
SELECTS: dict[str, str] = {
    RecoveryKind.RECOVER: MessageStatus.FAILED,
    RecoveryKind.REPLAY: MessageStatus.DELIVERED,
}


class RecoveryRefused(ValueError):
    """A recovery that cannot be started, and why, in words an operator can act on."""


@dataclass(frozen=True)
class Criteria:
    """What a recovery selects."""

    kind: str
    since: datetime
    until: datetime | None = None
    event_types: Sequence[str] = ()
    answer_classes: Sequence[str] = ()
    ordering_key_prefix: str = ""


@dataclass(frozen=True)
class Plan:
    """What a job would send: how many, the first few (key, event type, admitted at),
    the event types that match, the pace, and what the operator should know."""

    destination: str
    criteria: Criteria
    count: int
    sample: list[tuple[str, str, datetime]]
    matched_types: list[str] | None
    rate: float
    max_id: int
    warnings: list[str] = field(default_factory=list)

    @property
    def duration(self) -> timedelta:
        """How long its run takes at its rate, at least."""
        return timedelta(seconds=self.count / self.rate)


def recovery_plan(
    *,
    scope: Scope,
    destination: WebhookDestination | int,
    criteria: Criteria,
    rate: float | None = None,
    now: datetime | None = None,
) -> Plan:
    """Count and sample what a job would send, writing nothing. RecoveryRefused when the
    criteria or the rate cannot be; WebhookDestination.DoesNotExist when the scope holds
    no such destination."""
    now = now or timezone.now()
    dest = _destination(scope, destination)
    rate = _checked(dest, criteria, rate, now)
    max_id = scope.messages().aggregate(top=Max("id"))["top"] or 0
    matched = _matched_types(scope, dest, criteria, max_id)
    selected = selection(scope, dest, criteria, matched, max_id)
    if criteria.kind == RecoveryKind.MISSING:
        count = selected.values("key").distinct().count()
    else:
        count = selected.count()
    sample = list(
        selected.order_by("id").values_list("key", "event_type", "created_at")[:SAMPLE_SIZE]
    )
    warnings = []
    if not dest.enabled:
        warnings.append("the destination is disabled: nothing is sent until it is enabled")
    if criteria.kind == RecoveryKind.MISSING and dest.filter is not None:
        warnings.append("its filter applies: what it leaves out is written as discarded")
    return Plan(dest.name, criteria, count, sample, matched, rate, max_id, warnings)


def recovery_start(
    *,
    scope: Scope,
    destination: WebhookDestination | int,
    criteria: Criteria,
    by: str,
    rate: float | None = None,
    now: datetime | None = None,
) -> RecoveryJob:
    """Plan a job and start it: the relay process runs it from its next step. Refused
    (RecoveryRefused) as ``recovery_plan`` is, and while another job of the
    destination runs."""
    now = now or timezone.now()
    # counted before the job's transaction, holding no lock: the destination's row is the
    # relay's to lock while it sends
    dest = _destination(scope, destination)
    plan = recovery_plan(scope=scope, destination=dest, criteria=criteria, rate=rate, now=now)
    breaker_ended = (
        criteria.kind == RecoveryKind.RECOVER and destination_breaker(dest, now=now).state == "open"
    )
    try:
        with transaction.atomic():
            job = RecoveryJob.objects.create(
                destination=dest,
                kind=criteria.kind,
                since=criteria.since,
                until=criteria.until,
                event_types=list(criteria.event_types),
                answer_classes=list(criteria.answer_classes),
                ordering_key_prefix=criteria.ordering_key_prefix,
                matched_types=plan.matched_types,
                rate=plan.rate,
                state=RecoveryState.RUNNING,
                planned=plan.count,
                max_id=plan.max_id,
                created_by=by[:150],
                created_at=now,
                stepped_at=now,
            )
            if breaker_ended:
                # as destination_enable ends it: the status reads a change since updated_at
                scope.destinations().filter(pk=dest.pk).update(paused_until=None, updated_at=now)
                relay_wake_on_commit({dest.pk})
    except IntegrityError:  # the one running job a destination (its constraint)
        running = RecoveryJob.objects.filter(destination=dest, state=RecoveryState.RUNNING)
        number = running.values_list("pk", flat=True).first()
        raise RecoveryRefused(
            f"recovery #{number} of {dest.name} is running: cancel it, or wait for it to end"
        ) from None
    logger.info(
        "outbox: %s started recovery #%d of %s: %s, %d message(s) admitted since %s%s, at %g/s%s",
        by,
        job.pk,
        dest.name,
        RecoveryKind(job.kind).label.lower(),
        job.planned,
        criteria.since.isoformat(timespec="seconds"),
        f" until {criteria.until.isoformat(timespec='seconds')}" if criteria.until else "",
        job.rate,
        "; its breaker's pause ended" if breaker_ended else "",
        extra={"by": by, "destination": dest.name, "recovery": job.pk},
    )
    return job


def recovery_cancel(
    *, scope: Scope, job: RecoveryJob | int, by: str, now: datetime | None = None
) -> bool:
    """Stop a running job: it releases nothing more. What it released is sent (discard
    those messages to stop them too). False when it was not running;
    RecoveryJob.DoesNotExist when the scope holds no such job."""
    now = now or timezone.now()
    job_id = job if isinstance(job, int) else job.pk
    with transaction.atomic():
        found = scope.recovery_jobs().select_for_update().get(pk=job_id)
        if found.state != RecoveryState.RUNNING:
            return False
        found.state, found.cancelled_by, found.finished_at = RecoveryState.CANCELLED, by[:150], now
        found.save(update_fields=["state", "cancelled_by", "finished_at"])
    logger.info(
        "outbox: %s cancelled recovery #%d: %d of %d message(s) released",
        by,
        job_id,
        found.released,
        found.planned,
        extra={"by": by, "recovery": job_id},
    )
    return True


def recovery_jobs_shown(
    *, scope: Scope, destination_name: str | None = None, limit: int = 20
) -> list[RecoveryJob]:
    """The last jobs (of one destination, by name), newest first, each with its
    released messages counted by status (``sent_counts``)."""
    jobs = scope.recovery_jobs().select_related("destination")
    jobs = jobs.defer("destination__secrets", "destination__retiring_secrets")
    if destination_name is not None:
        jobs = jobs.filter(destination__name=destination_name)
    return list(with_sent_counts(jobs).order_by("-id")[:limit])


def with_sent_counts(jobs: QuerySet[RecoveryJob]) -> QuerySet[RecoveryJob]:
    """``jobs``, each with its released messages counted by their status now (one
    grouped query; read with ``sent_counts``)."""
    counted = {
        f"sent_{status}": Count("messages", filter=Q(messages__status=status))
        for status in MessageStatus.values
    }
    return jobs.annotate(**counted)


def sent_counts(job: RecoveryJob) -> dict[str, int]:
    """A job of ``with_sent_counts``'s: how many of its messages are in each status (those
    with any), in the statuses' order."""
    counts = {status: getattr(job, f"sent_{status}", 0) for status in MessageStatus.values}
    return {status: n for status, n in counts.items() if n}


def criteria_of(job: RecoveryJob) -> Criteria:
    """What ``job`` asked."""
    return Criteria(
        kind=job.kind,
        since=job.since,
        until=job.until,
        event_types=tuple(job.event_types or ()),
        answer_classes=tuple(job.answer_classes or ()),
        ordering_key_prefix=job.ordering_key_prefix,
    )


def _destination(scope: Scope, destination: WebhookDestination | int) -> WebhookDestination:
    destination_id = destination if isinstance(destination, int) else destination.pk
    return scope.destinations().defer("secrets").get(pk=destination_id)


def _checked(
    dest: WebhookDestination, criteria: Criteria, rate: float | None, now: datetime
) -> float:
    """The job's rate; RecoveryRefused for criteria that cannot be."""
    if criteria.kind not in RecoveryKind.values:
        raise RecoveryRefused(
            f"no recovery of kind {criteria.kind!r}: one of {', '.join(RecoveryKind.values)}"
        )
    horizon = now - timedelta(days=dest.replay_horizon_days)
    if criteria.since < horizon:
        raise RecoveryRefused(
            f"{criteria.since.isoformat(timespec='seconds')} is past {dest.name}'s replay "
            f"horizon of {dest.replay_horizon_days} days (replay_horizon_days): its receiving "
            "end may no longer remember those keys, and could apply them twice. Choose a start "
            f"at or after {horizon.isoformat(timespec='seconds')}."
        )
    if criteria.until is not None and criteria.until <= criteria.since:
        raise RecoveryRefused("the end (until) must come after the start (since)")
    unknown = sorted(set(criteria.answer_classes) - set(ANSWER_CLASSES))
    if unknown:
        raise RecoveryRefused(
            f"no answer class {', '.join(unknown)}: one of {', '.join(ANSWER_CLASSES)}"
        )
    if criteria.answer_classes and criteria.kind == RecoveryKind.MISSING:
        raise RecoveryRefused("a missing message was never answered: leave out answer classes")
    ceiling = dest.rate_count / dest.rate_seconds if dest.rate_seconds > 0 else 0.0
    if rate is None:
        rate = ceiling * DEFAULT_RATE_SHARE
    if not (MIN_RATE <= rate < ceiling):
        raise RecoveryRefused(
            f"a recovery's rate must be at least {MIN_RATE:g}/s and below {dest.name}'s own, "
            f"{ceiling:g}/s, so that live traffic keeps its share (asked: {rate:g}/s)"
        )
    return rate


def _matched_types(
    scope: Scope, dest: WebhookDestination, criteria: Criteria, max_id: int
) -> list[str] | None:
    """The event types the job selects, among those of the messages it could select:
    the asked ones (a name, or a prefix with ``group.*``), and for a missing job those
    the destination subscribes to. None: every type."""
    if criteria.kind != RecoveryKind.MISSING and not criteria.event_types:
        return None
    present = selection(scope, dest, criteria, None, max_id).values_list("event_type", flat=True)
    found = sorted(set(present.distinct().order_by()))
    if criteria.event_types:
        found = [t for t in found if _asked(criteria.event_types, t)]
    if criteria.kind == RecoveryKind.MISSING:
        found = [t for t in found if subscribed(dest.event_types or [], t)]
    return found


def _asked(asked: Iterable[str], name: str) -> bool:
    return any(name == a or in_group(a, name) for a in asked)


def selection(
    scope: Scope,
    dest: WebhookDestination,
    criteria: Criteria,
    matched_types: list[str] | None,
    max_id: int,
) -> QuerySet[OutboxMessage]:
    """The one query of a plan and its run: the messages the job releases (missing:
    the siblings' messages whose events it writes), admitted in its span, up to
    ``max_id``."""
    window = Q(created_at__gte=criteria.since, id__lte=max_id)
    if criteria.until is not None:
        window &= Q(created_at__lt=criteria.until)
    if criteria.ordering_key_prefix:
        window &= Q(ordering_key__startswith=criteria.ordering_key_prefix)
    if matched_types is not None:
        window &= Q(event_type__in=matched_types)
    if criteria.kind != RecoveryKind.MISSING:
        answered = Q()
        for answer in criteria.answer_classes:
            answered |= _answer_class(answer)
        return scope.messages().filter(
            window, answered, destination_id=dest.pk, status=SELECTS[criteria.kind]
        )
    own = OutboxMessage.objects.filter(destination_id=dest.pk, key=OuterRef("key"))
    siblings = (
        scope.messages().filter(destination__tenant=dest.tenant).exclude(destination_id=dest.pk)
    )
    return siblings.filter(window).filter(~Exists(own))


def _answer_class(answer: str) -> Q:
    if answer == "none":
        return Q(last_status_code__isnull=True)
    low = int(answer[0]) * 100
    return Q(last_status_code__gte=low, last_status_code__lt=low + 100)
