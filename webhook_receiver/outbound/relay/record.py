"""Recording a round: each answer's verdict on its message (fenced by the attempt the
claim counted), one attempt row each, the breaker, and the notices and log lines once
the round is durable. A round that cannot be recorded whole is recorded answer by
answer; what still cannot be is left to its lease.

On PostgreSQL a round is recorded by one statement, all of it or none, whatever
interrupts the worker: the one that claims the next round (``queries.CLAIM``, through
``relay_record_and_claim``), or one of its own (``queries.RECORD``). On SQLite, by its
three parts in one transaction.
What each answer means is ``policy.decide``'s, decided here; the SQL applies it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ...core import bounds, logs, storable
from .. import metrics, queries
from ..breaker import BreakerCount, breaker_count, breaker_opened_log
from ..models import MessageStatus, WebhookDestination
from ..retirement import Retirement, retirement_noticed, retirement_params
from .claim import CLAIM_BATCH, relay_claim
from .messages import RelayRound, Sent
from .policy import Decision, answer_text, decide, next_step_text
from .reporting import log_answer, notify_terminal
from .transport import EXCERPT_CHARS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Answers:
    """A round's answers made ready for its statement: each one's verdict and row, and
    the breaker's count."""

    results: list[Sent]
    verdicts: list[Decision]
    rows: list[dict[str, Any]]
    breaker: BreakerCount
    now: datetime


def _answers(dest: WebhookDestination, results: list[Sent], now: datetime) -> _Answers:
    verdicts = [decide(dest, sent, now) for sent in results]
    return _Answers(
        results,
        verdicts,
        [_answer(sent, v, now) for sent, v in zip(results, verdicts, strict=True)],
        breaker_count(
            dest,
            successes=sum(v.status == MessageStatus.DELIVERED for v in verdicts),
            failures=sum(v.breaker_failure for v in verdicts),
            now=now,
            gone=sum(v.gone for v in verdicts),
        ),
        now,
    )


def relay_record(
    dest: WebhookDestination, results: list[Sent], *, now: datetime | None = None
) -> None:
    """Record every answer of a round: the messages this claim still holds, one attempt
    row each, and the destination's breaker. In its own transaction, or in the caller's."""
    if not results:
        return
    answers = _answers(dest, results, now or timezone.now())
    with bounds.bounded_transaction():
        if connection.vendor == "postgresql":
            recorded, consecutive_failures, retirement = _record_postgresql(dest, answers)
        else:
            recorded, consecutive_failures, retirement = _record_sqlite(dest, answers)
        _recorded(dest, answers, recorded, consecutive_failures, retirement)


def relay_record_and_claim(
    dest: WebhookDestination, results: list[Sent], *, limit: int = CLAIM_BATCH
) -> RelayRound:
    """Record a round's answers and claim the next round (up to ``limit`` messages), in
    one transaction: one statement on PostgreSQL (``queries.CLAIM``), the record's and
    the claim's on SQLite."""
    now = timezone.now()
    if not results:
        return relay_claim(destination=dest, now=now, limit=limit)
    answers = _answers(dest, results, now)
    with bounds.bounded_transaction():
        if connection.vendor != "postgresql":
            recorded, consecutive_failures, retirement = _record_sqlite(dest, answers)
            _recorded(dest, answers, recorded, consecutive_failures, retirement)
            return relay_claim(destination=dest, limit=limit)
        params = _breaker_params(dest, answers)
        params.update(_columns(answers))
        # the claim's own now, taken as its statement goes: its tokens are spent then
        round_ = relay_claim(destination=dest, limit=limit, recording=params)
        _recorded(dest, answers, set(round_.recorded), round_.counted_failures, round_.retirement)
    return round_


def _recorded(
    dest: WebhookDestination,
    answers: _Answers,
    recorded: set[int] | frozenset[int],
    consecutive_failures: int | None,
    retirement: Retirement,
) -> None:
    """In the round's transaction, once its statement ran: the ops notices of terminal
    answers it recorded and of the destination's retirement, and the counters and log
    lines once it commits."""
    pairs = list(zip(answers.results, answers.verdicts, strict=True))
    for sent, v in pairs:
        if v.status == MessageStatus.FAILED and sent.message.id in recorded:
            # in the round's transaction: no notice for an answer not recorded
            answer = sent.error if sent.status_code is None else str(sent.status_code)
            notify_terminal(dest, sent.message, answer=answer)
    retirement_noticed(dest.name, retirement, answers.now)
    opened = answers.breaker.opened(consecutive_failures)
    # counted and logged once the answers are durable: a round that rolls back is sent
    # again
    transaction.on_commit(
        lambda: _committed(
            dest, pairs, set(recorded), answers.now, consecutive_failures if opened else None
        )
    )


def _answer(sent: Sent, v: Decision, now: datetime) -> dict[str, Any]:
    """One answer as the record's statement takes it (``queries.ANSWER_COLUMNS``)."""
    adapt = connection.ops.adapt_datetimefield_value
    m = sent.message
    delivered = v.status == MessageStatus.DELIVERED
    return {
        "message_id": m.id,
        "attempt": m.attempt,
        "status": str(v.status),
        "failures": m.failures + (1 if v.spends_budget else 0),
        "next_attempt_at": adapt(v.next_attempt_at or now),
        "delivered_at": adapt(now if delivered else None),
        "status_code": sent.status_code,
        "last_error": sent.error or ("" if delivered else sent.excerpt),
        "started_at": adapt(sent.started_at),
        "duration_ms": sent.duration_ms,
        "error": sent.error,
        "excerpt": sent.excerpt,
        "attempt_next_at": adapt(v.next_attempt_at),
    }


def _breaker_params(dest: WebhookDestination, answers: _Answers) -> dict[str, Any]:
    adapt = connection.ops.adapt_datetimefield_value
    breaker, now = answers.breaker, answers.now
    return {
        "destination_id": dest.pk,
        "round_successes": breaker.successes,
        "round_failures": breaker.failures,
        "round_gone": breaker.gone,
        "threshold": breaker.threshold,
        "paused_until": adapt(breaker.paused_until),
        "now": adapt(now),
        **retirement_params(now),
    }


def _columns(answers: _Answers) -> dict[str, str]:
    """The answers as the statement's ``answer`` reads them: one JSON array of objects,
    its moments in ISO 8601."""
    return {"answers": json.dumps(answers.rows, default=datetime.isoformat)}


def _record_postgresql(
    dest: WebhookDestination, answers: _Answers
) -> tuple[set[int], int | None, Retirement]:
    """The round's one statement: the messages it recorded, the breaker's count (None:
    not counted), and what it did to the destination's retirement."""
    params = _breaker_params(dest, answers)
    params.update(_columns(answers))
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD, params)
        recorded, consecutive_failures, retired, warned = cursor.fetchone()
    return set(recorded), consecutive_failures, Retirement(retired, bool(warned))


def _record_sqlite(
    dest: WebhookDestination, answers: _Answers
) -> tuple[set[int], int | None, Retirement]:
    """SQLite: the record's three parts, in the caller's transaction, the answers as
    VALUES (``answer``) before the first two."""
    rows = ", ".join(
        "(" + ", ".join(f"%(a{n}_{column})s" for column in queries.ANSWER_COLUMNS) + ")"
        for n in range(len(answers.rows))
    )
    values = {
        f"a{n}_{column}": answer[column]
        for n, answer in enumerate(answers.rows)
        for column in queries.ANSWER_COLUMNS
    }
    answered = queries.ANSWERS_SQLITE.format(rows=rows)
    with connection.cursor() as cursor:
        cursor.execute(f"{answered} {queries.RECORD_MESSAGES_SQLITE}", values)
        recorded = {row[0] for row in cursor.fetchall()}
        cursor.execute(f"{answered} {queries.RECORD_ATTEMPTS}", values)
        cursor.execute(queries.BREAKER_COUNT, _breaker_params(dest, answers))
        counted = cursor.fetchone()
    if not counted:
        return recorded, None, Retirement()
    return recorded, counted[0], Retirement(counted[1], bool(counted[2]))


def _committed(
    dest: WebhookDestination,
    answers: list[tuple[Sent, Decision]],
    recorded: set[int],
    now: datetime,
    paused_after: int | None,
) -> None:
    """After the round's commit: its counters, one log line per answer that was not a
    2xx (delivered ones are counted, not logged one by one), and the breaker's line if
    the round paused the destination (after that many consecutive failures)."""
    if paused_after is not None:
        breaker_opened_log(dest, paused_after)
    for sent, v in answers:
        message = sent.message
        if message.id not in recorded:
            log_answer(dest, message, answer_text(sent), "not recorded: its lease ran out")
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
        log_answer(dest, message, answer_text(sent), next_step_text(dest, sent, v, now))


def record_each(dest: WebhookDestination, results: list[Sent]) -> None:
    """The answers of a round that could not be recorded together, each in a transaction
    of its own: one that still fails is recorded without what its answer held (the
    verdict stands), and one that cannot be recorded at all is left to its lease."""
    for sent in results:
        try:
            with bounds.bounded_transaction(savepoint=True):
                relay_record(dest, [sent])
            continue
        except Exception as exc:
            stripped = replace(
                sent,
                excerpt="",
                error=storable.text(f"answer not recordable: {_error_line(exc)}", EXCERPT_CHARS),
            )
        try:
            with bounds.bounded_transaction(savepoint=True):
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
        with bounds.bounded_transaction(savepoint=True), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            cursor.execute(queries.RECORD_FAILED, [error, now, dest.pk])
    except Exception:
        logger.warning("outbox: %s: the failure to record could not be noted either", dest.name)


def _error_line(exc: BaseException) -> str:
    """The error's class and first line: PostgreSQL's DETAIL and CONTEXT lines may quote
    the values (the answer itself) that could not be stored."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
