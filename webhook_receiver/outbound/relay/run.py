"""A relay run of one destination: rounds of claim, send and record until nothing is
eligible, its limits stop it, or the run's time budget is spent; and the run as its
Celery task starts it (``relay_run``), which queues the follow-up its limits ask for."""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, OperationalError

from ...core import faults, logs, tracing
from .. import trigger
from ..models import WebhookDestination
from .claim import relay_claim
from .messages import Sent
from .record import record_each, record_failed, relay_record
from .transport import relay_send

logger = logging.getLogger(__name__)


def relay_destination(
    *, destination_id: int, budget_seconds: float = 20.0
) -> tuple[int, float | None]:
    """Relay one destination until it has nothing eligible, its limits stop it, or the
    time budget is spent. Returns (messages sent, seconds until it may send again or
    None).

    A round's answers are recorded in the transaction that claims the next round: one
    transaction a round, and in it no statement but the record's and the claim's (the
    claim returns the destination's row, which the next round sends and records with).
    If that transaction fails, the answers are recorded one by one, each in a
    transaction of its own (``record_each``), unless the database itself is failing (a
    bound that fired, a lost connection): then the error is noted on the destination
    and raised, and the messages are sent again, under the same keys and with the lost
    attempt counted, when their leases end."""
    deadline = time.monotonic() + budget_seconds
    dest: WebhookDestination | None = None
    sent_count = 0
    results: list[Sent] = []
    while True:
        more = time.monotonic() < deadline
        try:
            # one transaction a round: the last round's answers, then the next claim
            with faults.bounded_transaction(savepoint=True):
                if dest is not None:
                    relay_record(dest, results)
                # a worker already claiming for this destination carries on; this run stops
                round_ = (
                    relay_claim(destination=dest or destination_id, skip_if_busy=True)
                    if more
                    else None
                )
        except (DatabaseError, ValueError, TypeError, ArithmeticError) as exc:
            if not results or dest is None:
                raise
            record_failed(dest, exc)
            if isinstance(exc, OperationalError):
                raise  # the database is failing: one answer at a time would fail as well
            logs.log_failure(
                logger,
                "outbox: a round's answers could not be recorded together; recording them "
                "one by one",
                exc,
                destination=dest.name,
            )
            record_each(dest, results)
            results = []
            continue
        if round_ is None:
            return sent_count, 0.0
        if round_.destination is not None:
            dest = round_.destination
        if not round_.claimed or dest is None:
            return sent_count, round_.wait
        with tracing.span(
            "webhook.relay_round",
            destination=dest.name,
            messages=len(round_.claimed),
            links=[m.traceparent for m in round_.claimed],
        ):
            results = relay_send(dest, round_.claimed)
        sent_count += len(results)


def relay_run(destination_id: int) -> int:
    """A run as its task starts it (queued on commit of an admission, by the sweep, or as
    a follow-up): relay the destination, and when its token bucket is empty, queue the
    next run for when a token is due. A run stopped at its database bounds leaves its
    messages due for the next sweep. Returns how many messages it sent."""
    # this run is the one queued: later admissions must queue their own
    trigger.run_started(destination_id)
    sent, wait = 0, None
    with trigger.later_when_bounded(f"the relay of destination {destination_id}"):
        sent, wait = relay_destination(destination_id=destination_id)
    if wait is not None:
        trigger.follow_up(destination_id, wait)
    return sent
