"""The relay's Celery tasks (registered by ``webhook_receiver.tasks``, which imports
them): one destination's run, and the beat sweep that is the safety net for a lost
trigger."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery import shared_task
from django.core.cache import cache
from django.db import OperationalError
from django.db.models import Q
from django.utils import timezone

from ..core.faults import healing
from .models import MessageStatus, OutboxMessage
from .relay import bound_fired, bounded
from .relay import relay_destination as relay_run
from .retention import outbox_purge

logger = logging.getLogger(__name__)

# a token due sooner than this is waited for by the next run, not a task of its own
MIN_COUNTDOWN = 0.05
# a queued follow-up's marker outlives its countdown by this much: if the follow-up is
# lost with a worker, the next run after that queues another (the sweep runs meanwhile)
FOLLOW_UP_SLACK = 5.0


@shared_task(
    name="webhook_receiver.relay_destination",
    soft_time_limit=60,
    time_limit=90,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
@healing
def relay_destination(destination_id: int) -> int:
    """Relay one destination: queued on commit of each admission, and by the sweep.
    When its token bucket is empty, the next run is queued for when a token is due;
    a worker never sleeps for it.

    One follow-up at a time per destination: during a backlog, every admission's
    trigger finds the bucket empty, and each queuing its own follow-up would grow a
    herd of runs that fills the queue every destination shares.
    """
    # this run is the one queued (by a trigger or as a follow-up): later admissions must
    # queue their own
    cache.delete_many([queued_key(destination_id), _follow_up_key(destination_id)])
    sent, wait = 0, None
    with _later_when_bounded(f"the relay of destination {destination_id}"):
        sent, wait = relay_run(destination_id=destination_id)
    if wait is not None:
        countdown = max(wait, MIN_COUNTDOWN)
        # cache.add is atomic: only the first run to find the bucket empty queues one
        if cache.add(_follow_up_key(destination_id), 1, timeout=countdown + FOLLOW_UP_SLACK):
            relay_destination.apply_async((destination_id,), countdown=countdown)
    return sent


def queued_key(destination_id: int) -> str:
    """Set (in a shared cache) while a triggered run is queued and has not started."""
    return f"webhook_receiver:relay-queued:{destination_id}"


def _follow_up_key(destination_id: int) -> str:
    return f"webhook_receiver:relay-follow-up:{destination_id}"


@shared_task(
    name="webhook_receiver.relay_sweep", soft_time_limit=20, time_limit=30, ignore_result=True
)
@healing
def relay_sweep() -> int:
    """Queue a run for every destination with an eligible message: a trigger lost with a
    broker or a worker is made good within one sweep (every few seconds on beat)."""
    now = timezone.now()
    due = Q(status=MessageStatus.PENDING, next_attempt_at__lte=now) | Q(
        status=MessageStatus.SENDING, lease_until__lte=now
    )
    destinations: list[int] = []
    with _later_when_bounded("the relay sweep"), bounded():
        destinations = list(
            OutboxMessage.objects.filter(due, destination__enabled=True)
            .values_list("destination_id", flat=True)
            .distinct()
        )
    for destination_id in destinations:
        relay_destination.delay(destination_id)
    return len(destinations)


@contextmanager
def _later_when_bounded(what: str) -> Iterator[None]:
    """A lock or statement timeout of the relay's bounds (a locked outbox table) ends
    the run with one WARNING line: its messages stay due, and the next sweep (every few
    seconds) queues the run again. Anything else is raised."""
    try:
        yield
    except OperationalError as exc:
        if not bound_fired(exc):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        logger.warning(
            "outbox: %s stopped at its database bounds (%s: %s); the next sweep runs it again",
            what,
            type(exc).__name__,
            first,
            extra={"webhook": {"run": what, "error": type(exc).__name__}},
        )


@shared_task(
    name="webhook_receiver.purge_outbox",
    soft_time_limit=540,
    time_limit=600,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
@healing
def purge_outbox() -> int:
    """Delete delivered and discarded messages past their retention (daily on beat)."""
    return outbox_purge()
