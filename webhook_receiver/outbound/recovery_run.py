"""A recovery job's run (recovery.py says what a job is): steps, one short transaction
each, that the relay process takes every STEP_SECONDS for every running job. A step
releases the job's next messages in id order as its pace allows, and moves the job's
place (``last_id``) in the same transaction: a process killed between two steps leaves
the job where the last commit put it, and the next step (of any relay process) goes on
from there, releasing nothing twice.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from .admission import as_filtered
from .filters import filter_verdict
from .models import (
    MessageStatus,
    OutboxMessage,
    RecoveryJob,
    RecoveryKind,
    RecoveryState,
    WebhookDestination,
)
from .recovery import SELECTS, criteria_of, selection
from .relay.wakeups import relay_wake_on_commit
from .tenancy import EVERY_TENANT

logger = logging.getLogger(__name__)

# a job releases while fewer than this many seconds of its rate wait to be sent
RELEASED_AHEAD_SECONDS = 2.0
# messages one step releases at most (one short transaction)
STEP_MAX = 500
# how often the relay process steps the running jobs
STEP_SECONDS = 1.0


def recovery_steps(now: datetime | None = None) -> list[int]:
    """One step of every running job (the relay process calls this every STEP_SECONDS);
    the destinations whose messages were released, to wake. A job another process is
    stepping is left to it."""
    ids = RecoveryJob.objects.filter(state=RecoveryState.RUNNING).values_list("pk", flat=True)
    woken = []
    for job_id in list(ids):
        destination_id = recovery_step(job_id, now=now)
        if destination_id is not None:
            woken.append(destination_id)
    return woken


def recovery_step(job_id: int, *, now: datetime | None = None) -> int | None:
    """Release the job's next messages as its pace allows, in one transaction that also
    moves its place (``last_id``); the job is done once nothing is left to release.
    Returns its destination's id when it released any."""
    now = now or timezone.now()
    with transaction.atomic():
        job = (
            # the job's row alone: its destination's is the relay's to lock
            RecoveryJob.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("destination")
            .filter(pk=job_id, state=RecoveryState.RUNNING)
            .defer("destination__secrets")
            .first()
        )
        if job is None:
            return None
        ahead = max(1, math.ceil(job.rate * RELEASED_AHEAD_SECONDS))
        elapsed = max(0.0, (now - (job.stepped_at or now)).total_seconds())
        credit = min(float(ahead), job.credit + job.rate * elapsed)
        # what waits to be sent: the job's own, of which those that may go (not held
        # behind a failed message of their key: they wait for an operator, not the
        # relay), and the rest (live traffic, mostly)
        failed_before = OutboxMessage.objects.filter(
            destination_id=OuterRef("destination_id"),
            ordering_key=OuterRef("ordering_key"),
            id__lt=OuterRef("id"),
            status=MessageStatus.FAILED,
        ).exclude(ordering_key="")
        mine = Q(recovery_id=job.pk)
        open_now = OutboxMessage.objects.filter(
            destination_id=job.destination_id,
            status__in=(MessageStatus.PENDING, MessageStatus.SENDING),
        ).aggregate(
            everything=Count("id"),
            its_own=Count("id", filter=mine),
            sendable=Count("id", filter=mine & ~Q(Exists(failed_before))),
        )
        waiting, live = open_now["sendable"], open_now["everything"] - open_now["its_own"]
        room = min(int(credit), ahead - waiting, STEP_MAX)
        if _falling_behind(job, live):
            room = 0  # live traffic first: the destination has no room to spare
        released = 0
        if room > 0:
            released, last_id = _release(job, room, now)
            if last_id is None:
                job.state, job.finished_at = RecoveryState.DONE, now
            else:
                job.last_id = last_id
            job.released += released
            credit -= released
        job.credit, job.stepped_at, job.live_waiting = credit, now, live
        job.save(update_fields=[*_STEP_FIELDS])
        if released:
            relay_wake_on_commit({job.destination_id})
    if job.state == RecoveryState.DONE:
        logger.info(
            "outbox: recovery #%d of %s done: %d message(s) released of %d planned",
            job.pk,
            job.destination.name,
            job.released,
            job.planned,
            extra={"recovery": job.pk, "destination": job.destination.name},
        )
    return job.destination_id if released else None


# what a step writes of its job
_STEP_FIELDS = ("state", "finished_at", "last_id", "released", "credit", "stepped_at",
                "live_waiting")  # fmt: skip


def _falling_behind(job: RecoveryJob, live: int) -> bool:
    """Whether the destination's other messages waiting to be sent (``live``) are more
    than at the last step, and more than it has in flight at once: it is not keeping up
    with them. The job's messages are older, so the relay would send them first; a job
    that released more now would take the share live traffic needs. Messages held back
    behind the job's failed ones do not grow, so they never hold the job up."""
    before = job.live_waiting
    return before is not None and live > max(before, job.destination.max_in_flight)


def _release(job: RecoveryJob, room: int, now: datetime) -> tuple[int, int | None]:
    """Release up to ``room`` of the job's next messages; (how many, the last id it
    looked at, or None when nothing is left)."""
    dest = job.destination
    # the staff's scope: the job was scoped as it started, and its siblings are its
    # destination's tenant's (``selection``)
    selected = selection(EVERY_TENANT, dest, criteria_of(job), job.matched_types, job.max_id)
    next_rows = selected.filter(id__gt=job.last_id).order_by("id")
    if job.kind != RecoveryKind.MISSING:
        ids = list(next_rows.values_list("id", flat=True)[:room])
        if not ids:
            return 0, None
        changed = OutboxMessage.objects.filter(pk__in=ids, status=SELECTS[job.kind]).update(
            status=MessageStatus.PENDING,
            next_attempt_at=now,
            lease_until=None,
            failures=0,
            recovery=job,
        )
        return changed, ids[-1]
    # missing: the first sibling message of each event (key), written for this one
    rows, keys, last_id = [], set(), None
    for sibling in next_rows.only(*_COPIED, "id")[: room * 4]:
        last_id = sibling.id
        if sibling.key in keys:
            continue
        keys.add(sibling.key)
        rows.append(_written_for(dest, sibling, job, now))
        if len(rows) == room:
            break
    if last_id is None:
        return 0, None
    OutboxMessage.objects.bulk_create(rows, ignore_conflicts=True)
    written = OutboxMessage.objects.filter(destination=dest, recovery=job, key__in=keys).count()
    return written, last_id


# what a missing message takes from its sibling
_COPIED = ("key", "event_type", "payload", "metadata", "ordering_key", "origin_source",
           "origin_event_key")  # fmt: skip


def _written_for(
    dest: WebhookDestination, sibling: OutboxMessage, job: RecoveryJob, now: datetime
) -> OutboxMessage:
    """The message admission would write now for ``dest``, of the sibling's event."""
    left_out = filter_verdict(dest.filter, sibling.event_type, sibling.payload, sibling.metadata)
    return OutboxMessage(
        destination=dest,
        next_attempt_at=now,
        created_at=now,
        recovery=job,
        **as_filtered(left_out, now),
        **{name: getattr(sibling, name) for name in _COPIED},
    )
