"""A round in smaller steps: one the database refuses, recorded answer by answer; one
destination's claim, sending or record, each on its own (for tests and tools that take
a step at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime

from django.db import DatabaseError, OperationalError, connection
from django.utils import timezone

from ...core import bounds, logs, storable
from .. import queries
from ..models import WebhookDestination
from .database import interruption
from .messages import EXCERPT_CHARS, Claimed, Sent, Work
from .round import CLAIM_BATCH, Outcome, relay_round
from .rows import Rows
from .session import PeerTransport
from .transport import deliver

logger = logging.getLogger(__name__)

# what a round whose answers the database refuses raises (a value it cannot store, a
# constraint): not the database failing as a whole, which is an OperationalError
REFUSED = (DatabaseError, ValueError, TypeError, ArithmeticError)


def relay_round_or_apart(
    work: Sequence[Work], *, now: datetime | None = None, rows: Rows | None = None
) -> dict[int, Outcome]:
    """``relay_round``; if the database refuses it, each answer in a round of its own
    (``answers_record_each``), then the claims in a round without answers. If the
    database itself is failing (an OperationalError: a bound that fired, a lost
    connection), the failure is noted on each destination that had answers (the
    overview and webhook_status say ``record_failing``) and raised: the caller keeps
    the answers for a later round, or leaves them to their leases."""
    try:
        # bounded here, its own transaction (a savepoint inside a caller's): a round the
        # database refuses is rolled back alone
        with bounds.bounded_transaction(savepoint=True):
            return relay_round(work, now=now, rows=rows)
    except OperationalError as exc:
        if interruption(exc) is not None:
            raise  # Ctrl-C cut the round short: nothing more on its connection
        for w in work:
            if w.answers:
                record_failed(w.destination_id, exc)
        raise
    except REFUSED as exc:
        answered = [w for w in work if w.answers]
        for w in answered:
            record_failed(w.destination_id, exc)
        logs.log_failure(
            logger,
            "outbox: a round's answers could not be recorded together; recording them one by one",
            exc,
            destinations=",".join(str(w.destination_id) for w in answered),
        )
        recorded = {
            w.destination_id: answers_record_each(w.destination_id, w.answers) for w in answered
        }
    outcomes = relay_round([Work(w.destination_id, (), w.claim) for w in work], now=now, rows=rows)
    for key, done in recorded.items():
        if key in outcomes:
            outcomes[key] = replace(outcomes[key], recorded=outcomes[key].recorded | done)
    return outcomes


def answers_record_each(destination_id: int, answers: Sequence[Sent]) -> frozenset[int]:
    """Answers that could not be recorded together, each in a round of its own: one that
    still fails is recorded without what its answer held (the verdict stands, the error
    says why), and one that cannot be recorded at all is left to its lease. Returns the
    messages recorded."""
    done: set[int] = set()
    for sent in answers:
        attempt: Sent | None = sent
        while attempt is not None:
            try:
                with bounds.bounded_transaction(savepoint=True):
                    done |= relay_round([Work(destination_id, [attempt])])[destination_id].recorded
                break
            except OperationalError:
                raise
            except REFUSED as exc:
                if attempt is sent:
                    attempt = _stripped(sent, exc)
                    continue
                logs.log_failure(
                    logger,
                    "outbox: an answer not recorded; its lease runs out and it is sent again",
                    exc,
                    destination_id=destination_id,
                    key=sent.message.key,
                    attempt=sent.message.attempt,
                )
                attempt = None
    return frozenset(done)


def _stripped(sent: Sent, exc: BaseException) -> Sent:
    error = f"answer not recordable: {logs.error_line(exc)}"
    return replace(sent, excerpt="", error=storable.text(error, EXCERPT_CHARS))


def record_failed(destination_id: int, exc: BaseException) -> None:
    """Note on the destination that a round could not be recorded (the overview and
    webhook_status say so); never raises."""
    error = storable.text(logs.error_line(exc), 500)
    try:
        with bounds.bounded_transaction(savepoint=True), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(queries.RECORD_FAILED, [error, now, destination_id])
    except Exception:
        # the database is failing as a whole: the relay's outage line says so, once
        logger.debug("outbox: destination %s: the failure to record not noted", destination_id)


# --- a step at a time ----------------------------------------------------------------


def relay_claim(
    *, destination: WebhookDestination | int, now: datetime | None = None, limit: int = CLAIM_BATCH
) -> Outcome:
    """One destination's claim, in a round of its own (up to ``limit`` messages).
    ``WebhookDestination.DoesNotExist`` when there is no such destination."""
    key = destination if isinstance(destination, int) else destination.pk
    outcome = relay_round([Work(key, (), limit)], now=now)[key]
    if outcome.missing:
        raise WebhookDestination.DoesNotExist(f"no destination {key}")
    return outcome


def relay_record(
    dest: WebhookDestination | int, answers: Sequence[Sent], *, now: datetime | None = None
) -> Outcome:
    """One destination's answers recorded, in a round of its own that claims nothing."""
    key = dest if isinstance(dest, int) else dest.pk
    return relay_round([Work(key, answers, 0)], now=now)[key]


def relay_send(dest: WebhookDestination, claimed: Iterable[Claimed]) -> list[Sent]:
    """Send each claimed message once, concurrently, through a transport of its own, and
    wait for every answer (for a step at a time: tests, tools). Never raises for a
    message; answers oldest first."""

    async def send_all() -> list[Sent]:
        transport = PeerTransport()
        try:
            return list(await asyncio.gather(*(deliver(transport, dest, m) for m in claimed)))
        finally:
            await transport.close()

    return sorted(asyncio.run(send_all()), key=lambda sent: sent.message.id)
