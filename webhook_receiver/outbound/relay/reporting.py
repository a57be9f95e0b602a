"""What a recorded answer tells: one WARNING line per answer that was not a 2xx (or
request that got none), and the ops destination's notice of a terminal one. Called where
answers are recorded (record.py) or spent by the claim (claim.py); what an answer means
is policy.py's.
"""

from __future__ import annotations

import logging

from django.db import transaction

from ...core import storable
from ..models import WebhookDestination
from ..notices import terminal_notice
from .messages import Claimed

# the answer's line keeps the logger name operators filter it by (docs/upgrading.md)
logger = logging.getLogger("webhook_receiver.outbound.relay.policy")


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
