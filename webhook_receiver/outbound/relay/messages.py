"""What the relay holds of a message on its way: the claim's row, the answer, and a
destination's part of a round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


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


# what is kept of an answer's body: its first EXCERPT_BYTES, as text of EXCERPT_CHARS
EXCERPT_CHARS = 500
EXCERPT_BYTES = EXCERPT_CHARS * 4

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
class Work:
    """One destination's part of a round: the answers that came, and how many messages
    its claim may take at most (0: record only)."""

    destination_id: int
    answers: Sequence[Sent] = ()
    claim: int = 0
