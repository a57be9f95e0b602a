"""When relay runs happen: on commit of an admission or an operator's change, as the
follow-up a destination's token bucket asks for, and on the beat sweep, the safety net
that queues a run for every destination with something due.

Every trigger is an optimisation over the sweep: a trigger lost with the broker, a
worker or the cache costs a few seconds' delay, never a message. The runs themselves
are the ``webhook_receiver.relay_destination`` task (relay/run.py does the work), each
queued by ``relay_start``: through the seam (core/seam.py) a harness starts them itself.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.cache import cache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from .. import tasks
from ..core import bounds, outages, seam
from .models import MessageStatus, OutboxMessage

logger = logging.getLogger(__name__)

# how long "a run is queued" is believed without the run starting (a lost run: the beat
# sweep queues another meanwhile)
QUEUED_MARK_SECONDS = 10
# a token due sooner than this is waited for by the next run, not a task of its own
MIN_COUNTDOWN = 0.05
# a queued follow-up's marker outlives its countdown by this much: if the follow-up is
# lost with a worker, the next run after that queues another (the sweep runs meanwhile)
FOLLOW_UP_SLACK = 5.0
# a run that ends this close to the queued follow-up's due time is taken for that run
FOLLOW_UP_SKEW = 0.05

# The cache and the broker are optimisations here: without them, admissions go on to the
# table, and the beat sweep queues the relay runs that were not triggered.
cache_outage = outages.Outage(
    logger,
    "outbox cache",
    "admissions rely on the unique constraint alone, and relay runs are queued without "
    "their marks, until it answers",
)
broker_outage = outages.Outage(
    logger,
    "broker",
    "relay runs not triggered: new messages wait for the beat sweep (every few seconds) "
    "once it answers",
)


def relay_soon(destination_id: int) -> None:
    """Queue a relay run for the destination (admission calls it on commit). Not retried
    when the broker is down: the beat sweep makes a lost trigger good within seconds.

    With a cache that every process shares (Redis), a run already queued and not yet
    started takes this message too, so no second run is queued: a burst of admissions
    is one run, not a queue of them in front of every other destination's. (A
    per-process cache cannot tell; then each admission queues a run, and the runs that
    find another claiming leave at once.)"""

    def mark() -> bool:
        return cache.add(queued_key(destination_id), 1, QUEUED_MARK_SECONDS)

    # without the cache, a run too many is better than none
    if cache_is_shared() and not cache_outage.call(mark, True):
        return
    broker_outage.call(lambda: relay_start(destination_id, retry=False), None)


def relay_on_commit(destination_ids: set[int]) -> None:
    """A relay run per destination once the transaction commits (an operator's retry,
    discard or recovery). Not retried when the broker is down (robust: the operator's
    change stands): the beat sweep finds the messages due within seconds."""
    for dest_id in sorted(destination_ids):
        transaction.on_commit(functools.partial(relay_start, dest_id, retry=False), robust=True)


def relay_start(
    destination_id: int, *, countdown: float | None = None, retry: bool | None = None
) -> None:
    """Start a relay run of the destination, now or after ``countdown`` seconds: the
    Celery task, or the seam's ``relay`` when a harness put one in place. ``retry``
    (the publish's), when given, overrides Celery's setting."""
    start = seam.current().relay
    if start is not None:
        start(destination_id, countdown)
        return
    options: dict[str, Any] = {}
    if countdown is not None:
        options["countdown"] = countdown
    if retry is not None:
        options["retry"] = retry
    tasks.relay_destination.apply_async((destination_id,), **options)


def cache_is_shared() -> bool:
    """Whether Django's default cache is one for every process (not local memory)."""
    return not isinstance(caches["default"], LocMemCache | DummyCache)


def queued_key(destination_id: int) -> str:
    """Set (in a shared cache) while a triggered run is queued and has not started."""
    return f"webhook_receiver:relay-queued:{destination_id}"


def _follow_up_key(destination_id: int) -> str:
    return f"webhook_receiver:relay-follow-up:{destination_id}"


def run_started(destination_id: int) -> None:
    """The queued run (a trigger's or a follow-up) has started: later admissions must
    queue their own."""
    cache.delete(queued_key(destination_id))


def follow_up(destination_id: int, wait: float) -> None:
    """The destination's bucket is empty: queue the next run for when a token is due (a
    worker never sleeps for it). One follow-up at a time per destination: during a
    backlog, every admission's trigger finds the bucket empty, and each queuing its own
    follow-up would grow a herd of runs that fills the queue every destination shares.

    The mark holds the queued follow-up's due time. A run that ends before it (one a
    sweep or an admission started meanwhile) leaves it to that follow-up, rather than
    start a second chain of follow-ups, each taking half the tokens for the statements of
    a whole round; one that ends after it (the follow-up itself, or its run being late
    or lost) queues the next. "Before" allows FOLLOW_UP_SKEW for the follow-up's own run
    on a host whose clock is a little behind; one further behind leaves the chain to the
    sweep (seconds late, nothing lost)."""
    now = time.time()
    countdown = max(wait, MIN_COUNTDOWN)
    key = _follow_up_key(destination_id)
    due, queue = now + countdown, True
    # cache.add is atomic: of runs that find no mark, only the first queues one
    if not cache.add(key, due, timeout=countdown + FOLLOW_UP_SLACK):
        queued = cache.get(key)
        if queued is not None and queued > now + FOLLOW_UP_SKEW:
            # a follow-up is queued and not yet due: it claims what this one would
            due, queue = queued, False
        else:
            cache.set(key, due, timeout=countdown + FOLLOW_UP_SLACK)
    if queue:
        relay_start(destination_id, countdown=countdown)
    # The follow-up is the run queued for this destination: until it starts, an admission
    # queues none of its own (relay_soon finds this mark; this run, started, cleared it),
    # since a run before the next token is due could claim nothing. In a backlog (a flash
    # sale) that spares each admission a run of its own. The sweep still queues runs,
    # whatever the marks say.
    cache.set(queued_key(destination_id), 1, timeout=due - now + FOLLOW_UP_SLACK)


def outbox_sweep() -> int:
    """Queue a run for every destination with an eligible message: a trigger lost with a
    broker or a worker is made good within one sweep (every few seconds on beat). A
    destination its breaker paused is left until the pause ends (its run could claim
    nothing: a statement each sweep for no send); the first sweep after it queues the
    probe."""
    now = timezone.now()
    due = Q(status=MessageStatus.PENDING, next_attempt_at__lte=now) | Q(
        status=MessageStatus.SENDING, lease_until__lte=now
    )
    not_paused = Q(destination__paused_until__isnull=True) | Q(destination__paused_until__lte=now)
    destinations: list[int] = []
    with stops_at_database_bounds("the relay sweep"), bounds.bounded_transaction():
        destinations = list(
            OutboxMessage.objects.filter(due, not_paused, destination__enabled=True)
            # no ordering: the model's (-id) would make DISTINCT one row per message, and
            # the sweep queue a run per due message instead of one per destination
            .order_by()
            .values_list("destination_id", flat=True)
            .distinct()
        )
    for destination_id in destinations:
        relay_start(destination_id)
    return len(destinations)


@contextmanager
def stops_at_database_bounds(what: str) -> Iterator[None]:
    """A lock or statement timeout of the relay's bounds (a locked outbox table) ends
    the run with one WARNING line: its messages stay due, and the next sweep (every few
    seconds) queues the run again. Anything else is raised."""
    try:
        yield
    except OperationalError as exc:
        if not bounds.bound_fired(exc):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        logger.warning(
            "outbox: %s stopped at its database bounds (%s: %s); the next sweep runs it again",
            what,
            type(exc).__name__,
            first,
            extra={"webhook": {"run": what, "error": type(exc).__name__}},
        )
