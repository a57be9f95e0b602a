"""A relay run of one destination: its requests kept in flight up to its limits, each
answer recorded as it comes with the claim of what replaces it, until nothing is
eligible, its limits stop it, or the run's time budget is spent; and the run as its
lane starts it (``relay_run``), which queues the follow-up its limits ask for."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError, OperationalError

from ...core import bounds, logs, tracing
from .. import trigger
from ..encryption import SecretsUnreadable
from ..models import WebhookDestination
from .claim import relay_claim
from .messages import RelayRound, Sent
from .record import record_each, record_failed, relay_record, relay_record_and_claim
from .transport import ThreadWindow, Window

logger = logging.getLogger(__name__)

# how long a run goes on claiming: then it records what is in flight and ends (the
# lane, or the next trigger, starts another), so that no run holds a lane for ever
BUDGET_SECONDS = 20.0


def destination_relay(
    *,
    destination_id: int,
    budget_seconds: float = BUDGET_SECONDS,
    window: Window | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, float | None]:
    """Relay one destination until it has nothing eligible, its limits stop it, or the
    time budget is spent. Returns (answers recorded, seconds until it may send again or
    None).

    The first claim fills the window (the requests in flight) as far as the limits
    allow; then, as answers come, the ones that have come are recorded with the claim of
    the next messages, in one transaction: one statement on PostgreSQL
    (``relay_record_and_claim``), the claim's lease committed before any of them is
    sent. A slow answer holds its own slot and nothing else. If that transaction fails,
    the answers are recorded one by one, each in a transaction of its own
    (``record_each``), unless the database itself is failing (a bound that fired, a lost
    connection): then the error is noted on the destination and raised, and the
    messages are sent again, under the same keys and with the lost attempt counted, when
    their leases end. ``window`` and ``clock`` are where the evaluation harness puts its
    simulated network and time."""
    window = window if window is not None else ThreadWindow()
    deadline = clock() + budget_seconds
    with bounds.bounded_transaction(savepoint=True):
        round_ = relay_claim(destination=destination_id, skip_if_busy=True)
    dest = round_.destination
    if dest is None:  # a worker already claiming for this destination carries on
        return 0, None
    answered, spent = 0, False
    try:
        while True:
            _start(window, dest, round_)
            if not len(window):
                # a spent budget: the next run at once (its lane goes on, or another)
                return answered, 0.0 if spent else round_.wait
            answers = window.collect()
            answered += len(answers)
            spent = spent or clock() >= deadline
            if spent:
                _record(dest, answers)
                round_ = RelayRound(claimed=[])
            else:
                round_ = _record_and_claim(dest, answers)
                dest = round_.destination or dest
    finally:
        # an error leaves what is in flight to its lease; its answers are still awaited
        # (each by its deadline) so that no request outlives its run
        while len(window):
            window.collect()


def _start(window: Window, dest: WebhookDestination, round_: RelayRound) -> None:
    if round_.claimed:
        with tracing.span(
            "webhook.relay_round",
            destination=dest.name,
            messages=len(round_.claimed),
            links=[m.traceparent for m in round_.claimed],
        ):
            window.start(dest, round_.claimed)


def _record_and_claim(dest: WebhookDestination, answers: list[Sent]) -> RelayRound:
    """The answers that came, and the next claim, in one transaction; if that fails, the
    answers one by one (see destination_relay), then the claim alone."""
    try:
        with bounds.bounded_transaction(savepoint=True):
            return relay_record_and_claim(dest, answers)
    except (DatabaseError, ValueError, TypeError, ArithmeticError) as exc:
        _record_apart(dest, answers, exc)
    with bounds.bounded_transaction(savepoint=True):
        return relay_claim(destination=dest, skip_if_busy=True)


def _record(dest: WebhookDestination, answers: list[Sent]) -> None:
    try:
        with bounds.bounded_transaction(savepoint=True):
            relay_record(dest, answers)
    except (DatabaseError, ValueError, TypeError, ArithmeticError) as exc:
        _record_apart(dest, answers, exc)


def _record_apart(dest: WebhookDestination, answers: list[Sent], exc: Exception) -> None:
    record_failed(dest, exc)
    if isinstance(exc, OperationalError):
        raise exc  # the database is failing: one answer at a time would fail as well
    logs.log_failure(
        logger,
        "outbox: a round's answers could not be recorded together; recording them one by one",
        exc,
        destination=dest.name,
    )
    record_each(dest, answers)


def relay_run(
    destination_id: int,
    *,
    window: Window | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """A run as its lane starts it (for a task queued on commit of an admission, by the
    sweep, or as a follow-up): relay the destination, and when its token bucket is
    empty, queue the next run for when a token is due. A run stopped at its database
    bounds leaves its messages due for the next sweep. Returns how many answers it
    recorded."""
    # this run is the one queued: later admissions must queue their own
    trigger.run_started(destination_id)
    answered, wait = 0, None
    with trigger.stops_at_database_bounds(f"the relay of destination {destination_id}"):
        try:
            answered, wait = destination_relay(
                destination_id=destination_id, window=window, clock=clock
            )
        except SecretsUnreadable as exc:
            _say_unreadable(destination_id, exc)
            return 0
    if wait is not None:
        trigger.follow_up(destination_id, wait)
    return answered


# a destination no key reads is said again after this long (per process), not at every
# sweep's run: webhook_status and the admin show it meanwhile
UNREADABLE_REPEAT_SECONDS = 300.0
_unreadable_said_at: dict[tuple[int, str], float] = {}


def _say_unreadable(destination_id: int, exc: SecretsUnreadable) -> None:
    """A destination whose secrets no key decrypts: its claim failed as it read the row,
    so nothing was leased and its messages stay pending. One ERROR line, with no
    traceback (the cause is the keys, not the code), again every few minutes until new
    secrets are set or the key is back."""
    name = (
        WebhookDestination.objects.filter(pk=destination_id).values_list("name", flat=True).first()
    ) or str(destination_id)
    now = time.monotonic()
    said = _unreadable_said_at.get((destination_id, name))
    if said is not None and now - said < UNREADABLE_REPEAT_SECONDS:
        return
    _unreadable_said_at[(destination_id, name)] = now
    logger.error(
        "outbox: destination %s is not relayed (%s); its messages wait: %s",
        name,
        exc.state,
        exc,
        extra={"destination": name, "destination_id": destination_id},
    )
