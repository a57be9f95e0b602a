"""What the relay holds of a message on its way: the claim's row, and the answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..retirement import Retirement

if TYPE_CHECKING:
    from ..models import WebhookDestination


@dataclass(frozen=True)
class Claimed:
    id: int
    key: str
    event_type: str
    payload: Any
    attempt: int
    failures: int
    created_at: datetime
    traceparent: str = ""  # the admitting span's, with OpenTelemetry
    # when the claim spent its token (its `now`): the attempt's start as recorded, so
    # that the attempts' starts are the token bucket's own times (None: when sent)
    claimed_at: datetime | None = None


# Sent.refused_by: who refused a destination, so that no request was made
EGRESS_GUARD = "the egress guard"
EGRESS_PROXY = "the egress proxy"


@dataclass(frozen=True)
class Sent:
    message: Claimed
    started_at: datetime
    duration_ms: int
    status_code: int | None = None
    error: str = ""
    excerpt: str = ""
    retry_after: str | None = None
    # who refused the destination, no request made: "the egress guard" (its address) or
    # "the egress proxy" (it would not open a tunnel); "" when none did
    refused_by: str = ""


@dataclass(frozen=True)
class RelayRound:
    claimed: list[Claimed]
    # seconds until this destination may start another request (out of tokens), or None
    wait: float | None = None
    # another worker was claiming for this destination at that moment
    busy: bool = False
    # the destination's row as the claim read it (None when busy): the run's next
    # rounds send and record with it, and read it nowhere else
    destination: WebhookDestination | None = None
    # the statement that claimed also recorded the last round's answers (PostgreSQL):
    # the messages it recorded, and the breaker's count (None: not counted)
    recorded: frozenset[int] = frozenset()
    counted_failures: int | None = None
    # and what it did to the destination's retirement (retirement.py)
    retirement: Retirement = Retirement()
