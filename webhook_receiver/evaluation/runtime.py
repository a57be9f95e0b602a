"""What the run's relays run on: an asyncio event loop whose time is the simulated time
(``SimulatedLoop``), and the run's own thread for their database work (``RunDatabase``).

The relay is an asyncio program (outbound/relay/engine.py), so the run plays it on an
event loop of its own kind: the loop's ``time()`` is the simulated clock, and when
nothing is ready to run, the loop does not wait for its next timer, it moves the
clock to it (``advance``), as time-machine moves the wall clock the app's code reads.
Nothing in a run does real I/O (the merchants answer through the run's transport,
the database is worked on the run's own thread while the loop waits), so the loop's
only waits are timers, and an hour of traffic passes in seconds, the same way on
every machine.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..outbound.relay.database import CallerDatabase

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """A selector that never sleeps: with nothing ready, it moves the clock by the time
    the loop would have waited for its next timer."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self._advance(timeout)
        return ready


class SimulatedLoop(asyncio.SelectorEventLoop):
    """An event loop on the simulated clock: ``now()`` is its time, ``move_to(t)`` sets
    the clock to ``t`` (seconds since the scenario's start)."""

    def __init__(self, now: Callable[[], float], move_to: Callable[[float], None]) -> None:
        self._now = now
        self._move_to = move_to
        super().__init__(selector=_Selector(self._advance))

    def time(self) -> float:
        return self._now()

    def _advance(self, seconds: float) -> None:
        # to the next whole microsecond at or past the timer (the clock moves in whole
        # microseconds), so that the timer is due when the loop looks again
        target = math.ceil(round((self._now() + seconds) * 1_000_000, 3)) / 1_000_000
        self._move_to(max(target, self._now() + 1e-6))


class Counted(Protocol):
    """Whatever counts the run's statements by phase (the simulation)."""

    phase: str


# what the relay's database work counts for, by what the engine names it
PHASES = {"round": "relay", "poll": "sweep", "heartbeat": "other"}


class RunDatabase(CallerDatabase):
    """The run's thread does the database work; each call's statements count for its
    phase."""

    def __init__(self, simulation: Counted) -> None:
        super().__init__()
        self._simulation = simulation

    def wrapped(self, fn: Callable[[], T], what: str) -> Callable[[], T]:
        simulation = self._simulation

        def counted() -> T:
            simulation.phase = PHASES.get(what, what or "other")
            try:
                return fn()
            finally:
                simulation.phase = "other"

        return counted
