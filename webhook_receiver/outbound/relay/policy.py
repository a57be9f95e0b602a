"""What an answer means for its message (delivered, deferred, terminal; the retry budget
and the breaker), and in words: an answer in, a decision out. Recording it, its log
line and its notice are reporting.py's, called where the answer is recorded.

A 2xx delivers. 400, 401, 403, 404 and 422 are terminal at once: no retry changes
them, an operator does. A 410 Gone retires the destination (retirement.py): the message
is held pending, spending nothing, until an operator enables the destination again.
A 429 or 503 with a readable Retry-After defers the message as
asked (capped) without spending its budget. Anything else, and no answer at all, is
retried under the same key with full-jitter backoff until the budget is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ...core.backoff import full_jitter
from ...network.peer_http import parse_retry_after
from ...presentation.display import duration_text
from ..models import MessageStatus, WebhookDestination
from ..retirement import GONE_STATUS
from .messages import EGRESS_GUARD, Sent

# answers that no retry will change: for an operator
TERMINAL_STATUSES = frozenset({400, 401, 403, 404, 422})


# answers that may carry Retry-After: the destination pacing us
PACING_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Decision:
    status: str  # a MessageStatus
    next_attempt_at: datetime | None
    spends_budget: bool
    breaker_failure: bool
    # a 410 Gone: the destination is disabled, the message held
    gone: bool = False


def decide(dest: WebhookDestination, sent: Sent, now: datetime) -> Decision:
    """What one answer means for its message (the issue's table, in one place)."""
    code = sent.status_code
    if code is not None and 200 <= code < 300:
        return Decision(MessageStatus.DELIVERED, None, spends_budget=False, breaker_failure=False)
    if code == GONE_STATUS:
        # the endpoint is gone, not this message: held for when it is enabled again
        return Decision(
            MessageStatus.PENDING, now, spends_budget=False, breaker_failure=False, gone=True
        )
    if code in TERMINAL_STATUSES or sent.refused_by:
        # refused by the egress guard or proxy: no retry changes the address or the
        # proxy's rules, and the destination did not fail (its breaker is not counted)
        return Decision(MessageStatus.FAILED, None, spends_budget=True, breaker_failure=False)
    if code in PACING_STATUSES:
        wait = parse_retry_after(sent.retry_after, now=now, cap=dest.retry_after_cap_seconds)
        if wait is not None:
            # the destination is pacing us: later, without spending the retry budget
            at = now + timedelta(seconds=wait)
            return Decision(
                MessageStatus.PENDING, at, spends_budget=False, breaker_failure=code == 503
            )
    # other answers, timeouts and connection errors: backoff, same key
    if sent.message.failures + 1 >= dest.max_attempts:
        return Decision(MessageStatus.FAILED, None, spends_budget=True, breaker_failure=True)
    wait = full_jitter(
        sent.message.failures + 1, base=dest.backoff_base_seconds, cap=dest.backoff_cap_seconds
    )
    return Decision(
        MessageStatus.PENDING,
        now + timedelta(seconds=wait),
        spends_budget=True,
        breaker_failure=True,
    )


def answer_text(sent: Sent) -> str:
    """The answer in words, for the log line."""
    if sent.status_code is None:
        return f"gave no answer ({sent.error})"
    return f"answered {sent.status_code}"


def next_step_text(dest: WebhookDestination, sent: Sent, v: Decision, now: datetime) -> str:
    """What happens to the message next, in words, for the log line."""
    if v.status == MessageStatus.FAILED:
        if sent.status_code in TERMINAL_STATUSES:
            return "failed for good (a terminal answer), waiting for an operator"
        if sent.refused_by == EGRESS_GUARD:
            return "failed for good (an address the egress guard refuses), waiting for an operator"
        if sent.refused_by:
            return f"failed for good (refused by {sent.refused_by}), waiting for an operator"
        return f"failed for good: {dest.max_attempts} attempts spent, waiting for an operator"
    if v.gone:
        return "held: the destination is gone (disabled until an operator enables it)"
    wait = duration_text((v.next_attempt_at or now) - now)
    if not v.spends_budget:
        return f"deferred {wait} as Retry-After asks"
    return f"retried in {wait} (failure {sent.message.failures + 1} of {dest.max_attempts})"
