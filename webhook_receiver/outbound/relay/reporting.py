"""What a round tells: one WARNING line per answer that was not a 2xx (or request that
got none), the ops destination's notice of a terminal message, the breaker's line when
it opens, retirement's notice and line, and the counters of deliveries; and one line per
stretch of the relay's database work failing (``DatabaseTrouble``). In the round's
transaction for what must commit with it (the notices, themselves outbox messages), and
once it commits for the rest. What an answer means is policy.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import DatabaseError, OperationalError, transaction

from ...core import bounds, logs, outages, storable
from ...core.encryption import SecretsUnreadable
from .. import metrics
from ..breaker import breaker_opened_log
from ..models import MessageStatus, WebhookDestination
from ..notices import terminal_notice
from ..retirement import Retirement, retirement_noticed
from .limits import After
from .messages import Claimed, Sent
from .policy import Decision, answer_text, next_step_text

# the answer's line keeps the logger name operators filter it by (docs/upgrading.md)
logger = logging.getLogger("webhook_receiver.outbound.relay.policy")


def round_reported(
    dest: WebhookDestination,
    answers: Sequence[Sent],
    verdicts: Sequence[Decision],
    recorded: frozenset[int],
    spent: Sequence[Claimed],
    after: After,
    now: datetime,
) -> None:
    """In the round's transaction: the ops notices of the terminal answers it recorded,
    of the messages its claim failed (a lost attempt spent their budget) and of the
    destination's retirement; the counters and log lines once it commits."""
    pairs = list(zip(answers, verdicts, strict=True))
    for sent, v in pairs:
        if v.status == MessageStatus.FAILED and sent.message.id in recorded:
            answer = sent.error if sent.status_code is None else str(sent.status_code)
            notify_terminal(dest, sent.message, answer=answer)
    for message in spent:
        notify_terminal(dest, message, answer="attempt not recorded")
    if after.retired is not None or after.warned:  # most rounds: neither, nothing to notice
        retirement_noticed(dest.name, Retirement(after.retired, after.warned), now)
    transaction.on_commit(lambda: _committed(dest, pairs, recorded, list(spent), after, now))


def _committed(
    dest: WebhookDestination,
    pairs: list[tuple[Sent, Decision]],
    recorded: frozenset[int],
    spent: list[Claimed],
    after: After,
    now: datetime,
) -> None:
    """After the round's commit: its counters, one log line per answer that was not a
    2xx (delivered ones are counted, not logged one by one), a line per message its
    claim failed, and the breaker's line if the round paused the destination."""
    if after.opened:
        breaker_opened_log(dest, after.consecutive_failures)
    for sent, v in pairs:
        message = sent.message
        if message.id not in recorded:
            log_answer(dest, message, answer_text(sent), "not recorded: its lease ran out")
            continue
        if v.status == MessageStatus.DELIVERED:
            metrics.delivery_record(
                dest.name, created_at=message.created_at, delivered_at=now, attempts=message.attempt
            )
            continue
        if v.status == MessageStatus.FAILED:
            metrics.terminal_count(dest.name)
        log_answer(dest, message, answer_text(sent), next_step_text(dest, sent, v, now))
    for message in spent:
        then = f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
        log_answer(dest, message, "gave no recorded answer", then)
        metrics.terminal_count(dest.name)


def log_answer(dest: WebhookDestination, message: Claimed, answer: str, then: str) -> None:
    """One WARNING line per answer that was not a 2xx, or request that got none."""
    answer = storable.text(answer, 300)
    logger.warning(
        "outbox: %s %s to %s, attempt %d: %s",
        dest.name,
        answer,
        storable.text(message.key, 255),
        message.attempt,
        then,
        extra={
            "webhook": {
                "destination": dest.name,
                "key": message.key,
                "attempt": message.attempt,
                "answer": answer,
                "next": then,
            }
        },
    )


def notify_terminal(dest: WebhookDestination, message: Claimed, *, answer: str) -> None:
    """Tell the ops destination (if any); a failure here never fails the round (a
    savepoint of its own when the round's transaction is open)."""
    try:
        with transaction.atomic():
            terminal_notice(
                destination=dest.name,
                message_id=message.id,
                key=message.key,
                event_type=message.event_type,
                answer=answer,
            )
    except Exception:
        logger.exception("terminal notice for %s not admitted", message.key)


# a destination no key reads is said again after this long, not at every round
UNREADABLE_REPEAT_SECONDS = 300.0


class Unreadable:
    """A relay's lines about destinations whose secrets no key decrypts: nothing is
    claimed for such a destination, so its messages stay pending. One ERROR line, with
    no traceback (the cause is the keys, not the code), again every few minutes until
    new secrets are set or the key is back."""

    def __init__(self) -> None:
        self._said = logs.SaidOnce(every=UNREADABLE_REPEAT_SECONDS)

    def say(self, dest: WebhookDestination, exc: SecretsUnreadable) -> None:
        if not self._said.met(dest.pk):
            return
        logging.getLogger("webhook_receiver.outbound.relay.engine").error(
            "outbox: destination %s is not relayed (%s); its messages wait: %s",
            dest.name,
            exc.state,
            exc,
            extra={"destination": dest.name, "destination_id": dest.pk},
        )


class DatabaseTrouble:
    """The relay's database work failing, told once a stretch: a table held (a lock or
    statement bound fired: a migration, VACUUM FULL), or the database not answering; a
    success ends the stretch with its line. Anything else is logged as the failure it
    is."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self.outage = outages.Outage(
            log,
            "outbox: the database",
            "the relay's rounds are tried again every second; answers not recorded meanwhile "
            "wait in memory, and their messages are sent again when their leases end",
        )
        self.held = outages.Outage(
            log,
            "outbox: the relay",
            "a table is held (a migration, VACUUM FULL?); tried again every second, the "
            "answers kept meanwhile, and the messages sent again when their leases end",
            state="stopped at its database bounds",
        )

    def failed(self, exc: Exception, what: str) -> None:
        if isinstance(exc, OperationalError) and bounds.bound_fired(exc):
            self.held.failed(exc)
        elif isinstance(exc, DatabaseError):
            self.outage.failed(exc)
        else:
            logs.log_failure(self._log, what, exc)

    def answered(self) -> None:
        self.outage.answered()
        self.held.answered()
