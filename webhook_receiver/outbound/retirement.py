"""Endpoints that retire themselves: a destination that answers 410 Gone, or whose
answers have failed with no success for DISABLE_AFTER_FAILING_DAYS, is disabled by the
relay (the Standard Webhooks advice; Svix's five days), its reason and time on its row,
its messages held pending (not failed) until an operator enables it again
(operations.destination_enable) or discards them.

The decision rides in the relay's own statements (``queries._retired``, counted with
the breaker): no statement is added to a round. What is here: the statement's
parameters, and what follows a round that retired or warned (an ops notice in the
round's transaction, one log line once it commits).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from ..conf import app_settings
from ..presentation.display import duration_text
from .notices import ops_notice_enqueue

logger = logging.getLogger(__name__)

# the reason a 410 leaves on the destination's row
GONE_REASON = "answered 410 Gone: the endpoint says it was removed"
# the answer that retires a destination at once
GONE_STATUS = 410


@dataclass(frozen=True)
class Retirement:
    """What a round's statement did to its destination's retirement: the reason it
    disabled it (None: it did not), and whether it warned of its failing span."""

    retired: str | None = None
    warned: bool = False


def failing_reason() -> str:
    span = app_settings().disable_after_failing
    return f"no success for {duration_text(span) if span else '-'} while its messages failed"


def retirement_params(now: datetime) -> dict[str, Any]:
    """The statement's parameters for retirement at ``now`` (round_gone is the round's)."""
    settings = app_settings()
    span = settings.disable_after_failing
    adapt = connection.ops.adapt_datetimefield_value
    return {
        "gone_reason": GONE_REASON,
        "failing_reason": failing_reason(),
        "disable_before": adapt(now - span) if span else None,
        "warn_before": adapt(now - span * settings.disable_warning_fraction) if span else None,
    }


# the statement's parameters when no answer is recorded
NO_RETIREMENT: dict[str, Any] = {
    "round_gone": 0,
    "gone_reason": "",
    "failing_reason": "",
    "disable_before": None,
    "warn_before": None,
}


def retirement_noticed(name: str, retirement: Retirement, now: datetime) -> None:
    """In the round's transaction, once its statement retired or warned: the ops
    notice (never for the ops destination itself: no loop; a failure here never fails
    the round), and the log line once the round commits."""
    if retirement.retired is None and not retirement.warned:
        return
    if name != app_settings().ops_destination:
        try:
            with transaction.atomic():
                _notice(name, retirement, now)
        except Exception:
            logger.exception("retirement notice for %s not admitted", name)
    transaction.on_commit(lambda: retirement_log(name, retirement))


def _notice(name: str, retirement: Retirement, now: datetime) -> None:
    span = app_settings().disable_after_failing
    if retirement.retired is not None:
        ops_notice_enqueue(
            event_type="outbox.destination_disabled",
            key=f"outbox:{name}:disabled:{now.isoformat()}",
            data={"destination": name, "reason": retirement.retired, "at": now.isoformat()},
        )
        return
    ops_notice_enqueue(
        event_type="outbox.destination_failing",
        key=f"outbox:{name}:failing:{now.isoformat()}",
        data={
            "destination": name,
            "reason": f"its messages have failed with no success for over "
            f"{duration_text(span * app_settings().disable_warning_fraction) if span else '-'}",
            "disabled_after": duration_text(span) if span else None,
        },
    )


def retirement_log(name: str, retirement: Retirement) -> None:
    """The one WARNING line of a retirement, or of its warning."""
    if retirement.retired is not None:
        logger.warning(
            "outbox: destination %s disabled: %s; its messages are held until it is enabled",
            name,
            retirement.retired,
            extra={"webhook": {"destination": name, "disabled": retirement.retired}},
        )
    elif retirement.warned:
        span = app_settings().disable_after_failing
        logger.warning(
            "outbox: destination %s has had no success for a while; it is disabled after %s "
            "without one",
            name,
            duration_text(span) if span else "-",
            extra={"webhook": {"destination": name, "failing": True}},
        )
