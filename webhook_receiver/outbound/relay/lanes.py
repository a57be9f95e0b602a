"""A relay's lanes: one destination's work in a relay process (engine.py), a few fields
in a dict; a lane with nothing in flight, nothing to record and nothing due is dropped,
so a process holds lanes for the destinations it is relaying now, not for every one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..models import WebhookDestination
from .messages import Sent
from .round import CLAIM_BATCH

# what a lane's claim may take before its destination's row is read: the model's default
# in-flight limit (a destination that allows more claims the rest in its next round),
# not a round's most: the claims reserve the process's RELAY_MAX_REQUESTS, and a first
# round of 200 destinations reserving 10 each would leave half of them none
CLAIM_ROOM_DEFAULT = WebhookDestination._meta.get_field("max_in_flight").get_default()


@dataclass(eq=False)
class Lane:
    """One destination's work in this process."""

    destination_id: int
    # the row as the last round read it: what its requests are signed and sent with
    destination: WebhookDestination | None = None
    answers: list[Sent] = field(default_factory=list)
    in_flight: int = 0
    # a claim is wanted (woken, or its last claim took all it asked for)
    wanted: bool = False
    # in a round now, and woken meanwhile (what woke it may have come after the round's
    # snapshot: the round's own answer does not settle whether a claim is wanted)
    in_round: bool = False
    woken_in_round: bool = False
    # a timer that will want a claim (the bucket's tokens, the breaker's pause)
    timer: asyncio.TimerHandle | None = None
    # the timer waits for the bucket: nothing can be claimed before it, a wake included
    for_tokens: bool = False

    def claim_room(self) -> int:
        """Messages this lane's claim may take, by its destination's own limit."""
        dest = self.destination
        room = CLAIM_ROOM_DEFAULT if dest is None else min(CLAIM_BATCH, dest.max_in_flight)
        return max(0, room - self.in_flight)

    def idle(self) -> bool:
        return not (self.answers or self.in_flight or self.wanted or self.in_round or self.timer)


@dataclass(frozen=True)
class Summary:
    """What a relay did, for its caller (``relay_destination``) and its log line."""

    answered: int
    wait: float | None
