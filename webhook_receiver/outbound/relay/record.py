"""Recording a round: each answer's verdict on its message (fenced by the attempt the
claim counted), one attempt row each, the breaker, and the notices and log lines once
the round is durable. A round that cannot be recorded whole is recorded answer by
answer; what still cannot be is left to its lease.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ...core import faults, logs, storable
from .. import metrics, queries
from ..breaker import breaker_record
from ..models import MessageStatus, WebhookDestination
from .messages import Sent
from .policy import Verdict, answer_log, answer_words, ops_notice_terminal, verdict, what_next
from .transport import EXCERPT_CHARS

logger = logging.getLogger(__name__)


def relay_record(
    dest: WebhookDestination, results: list[Sent], *, now: datetime | None = None
) -> None:
    """Record every answer of a round: the messages this claim still holds, one attempt
    row each, and the destination's breaker. In its own transaction, or in the caller's
    (relay_destination records a round in the transaction that claims the next)."""
    if not results:
        return
    now = now or timezone.now()
    adapt = connection.ops.adapt_datetimefield_value
    verdicts = [verdict(dest, sent, now) for sent in results]
    # (the new values, then the attempt that fences them) -> the messages they go to
    outcomes: dict[tuple[Any, ...], list[int]] = {}
    for sent, v in zip(results, verdicts, strict=True):
        m = sent.message
        delivered = v.status == MessageStatus.DELIVERED
        outcome = (
            v.status,
            m.failures + (1 if v.spends_budget else 0),
            adapt(v.next_attempt_at or now),
            adapt(now if delivered else None),
            sent.status_code,
            sent.error or ("" if delivered else sent.excerpt),
            m.attempt,
        )
        outcomes.setdefault(outcome, []).append(m.id)
    attempt_rows = [
        (
            sent.message.id,
            sent.message.attempt,
            adapt(sent.started_at),
            sent.duration_ms,
            sent.status_code,
            sent.error,
            sent.excerpt,
            adapt(v.next_attempt_at),
        )
        for sent, v in zip(results, verdicts, strict=True)
    ]
    recorded: set[int] = set()
    with faults.bounded_transaction(), connection.cursor() as cursor:
        for (*values, attempt), ids in outcomes.items():
            cursor.execute(
                queries.RECORD.format(ids=_placeholders(len(ids))), [*values, *ids, attempt]
            )
            recorded.update(row[0] for row in cursor.fetchall())
        rows = ", ".join([f"({_placeholders(len(attempt_rows[0]))})"] * len(attempt_rows))
        cursor.execute(queries.ATTEMPTS.format(rows=rows), [x for row in attempt_rows for x in row])
        breaker_record(
            dest,
            successes=sum(v.status == MessageStatus.DELIVERED for v in verdicts),
            failures=sum(v.breaker_failure for v in verdicts),
            now=now,
        )
        for sent, v in zip(results, verdicts, strict=True):
            if v.status == MessageStatus.FAILED and sent.message.id in recorded:
                # in the round's transaction: no notice for an answer not recorded
                answer = sent.error if sent.status_code is None else str(sent.status_code)
                ops_notice_terminal(dest, sent.message, answer=answer)
        # counted and logged once the answers are durable: a round that rolls back is
        # sent again
        transaction.on_commit(
            lambda: _recorded(dest, list(zip(results, verdicts, strict=True)), recorded, now)
        )


def _recorded(
    dest: WebhookDestination,
    answers: list[tuple[Sent, Verdict]],
    recorded: set[int],
    now: datetime,
) -> None:
    """After the round's commit: its counters, and one log line per answer that was not
    a 2xx (delivered ones are counted, not logged one by one)."""
    for sent, v in answers:
        message = sent.message
        if message.id not in recorded:
            answer_log(dest, message, answer_words(sent), "not recorded: its lease ran out")
            continue
        if v.status == MessageStatus.DELIVERED:
            metrics.delivery_record(
                dest.name,
                created_at=message.created_at,
                delivered_at=now,
                attempts=message.attempt,
            )
            continue
        if v.status == MessageStatus.FAILED:
            metrics.terminal_count(dest.name)
        answer_log(dest, message, answer_words(sent), what_next(dest, sent, v, now))


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def record_each(dest: WebhookDestination, results: list[Sent]) -> None:
    """The answers of a round that could not be recorded together, each in a transaction
    of its own: one that still fails is recorded without what its answer held (the
    verdict stands), and one that cannot be recorded at all is left to its lease."""
    for sent in results:
        try:
            with faults.bounded_transaction(savepoint=True):
                relay_record(dest, [sent])
            continue
        except Exception as exc:
            stripped = replace(
                sent,
                excerpt="",
                error=storable.text(f"answer not recordable: {_error_line(exc)}", EXCERPT_CHARS),
            )
        try:
            with faults.bounded_transaction(savepoint=True):
                relay_record(dest, [stripped])
        except Exception as exc:
            logs.log_failure(
                logger,
                "outbox: an answer not recorded; its lease runs out and it is sent again",
                exc,
                destination=dest.name,
                key=sent.message.key,
                attempt=sent.message.attempt,
            )


def record_failed(dest: WebhookDestination, exc: BaseException) -> None:
    """Note on the destination that a round could not be recorded (the overview and
    webhook_status say so); never raises."""
    error = storable.text(_error_line(exc), 500)
    try:
        with faults.bounded_transaction(savepoint=True), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(queries.RECORD_FAILED, [error, now, dest.pk])
    except Exception:
        logger.warning("outbox: %s: the failure to record could not be noted either", dest.name)


def _error_line(exc: BaseException) -> str:
    """The error's class and first line: PostgreSQL's DETAIL and CONTEXT lines may quote
    the values (the answer itself) that could not be stored."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
