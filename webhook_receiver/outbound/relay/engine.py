"""The relay of one process: one asyncio event loop, every destination with work a lane on
it, a fixed number of database connections, and one scheduler.

**What a process holds.** A lane is a few fields in a dict: the destination's answers
that came and are not yet recorded, its requests in flight (each an asyncio task and
a connection of the one aiohttp session), and whether a claim is wanted and when. A
lane with nothing in flight, nothing to record and nothing due is dropped. So the
threads and database connections of a process do not depend on the number of
merchants: the loop's thread, ``RELAY_DATABASE_CONNECTIONS`` threads with a connection
each (rounds, the poll and the heartbeat take turns on them), the listener's connection
on PostgreSQL, and the resolver's few threads. Requests in flight are bounded by
``RELAY_MAX_REQUESTS`` for the process as a whole, each destination's by its own limit.

**One scheduler.** Whether a destination is relayed now is decided here and nowhere
else. A lane wants a claim when it is woken: by an admission (``pg_notify`` in its
transaction, heard on ``LISTEN``), by the poll (every ``RELAY_POLL_SECONDS``: the
destinations with a message due, which finds what no notification reached: SQLite,
PgBouncer in transaction mode, a retry whose backoff ended, a lease that ran out), by
its own timer (its bucket's next tokens, the end of its breaker's pause), or by the
round before it, when its claim took all it asked for. An answer that comes is recorded
by the next round, which claims its replacement in the same statement.

**Rounds.** Ready lanes are taken together into a round (round.py: two statements on
PostgreSQL for any number of destinations), at most ``RELAY_DATABASE_CONNECTIONS``
rounds at once, each on its own destinations. While a round runs, answers and wake-ups
gather for the next: under load a round carries many destinations' work, and when
idle a lone message costs its own. No lane waits for another destination's merchant: a
merchant that never answers holds its own requests until its timeout, nothing else.

**Faults.** A round the database refuses is recorded answer by answer; one it cannot
run (an outage, a bound that fired) keeps its answers for the next try, a second later,
with one line per outage. The leases make every crash safe: a relay killed, frozen or
cut off leaves its messages leased, and they are claimed again under their keys when
the leases run out; an answer recorded after that is fenced off (round.py). A relay
told to stop claims nothing more, waits up to FINISH_SECONDS for its requests in
flight, records their answers, and ends.

process.py runs a process's relay (``manage.py webhook_relay``; it steps recovery jobs
too), and one destination on the caller's connection (tests, tools). The evaluation
harness runs the same ``Relay`` on a simulated clock (evaluation/simulation.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from django.utils import timezone

from ...core import tracing
from ..models import WebhookDestination
from ..recovery_run import STEP_SECONDS, recovery_steps
from .database import Database
from .lanes import Lane, Summary
from .messages import Claimed, Work
from .reporting import DatabaseTrouble, Unreadable
from .round import Outcome
from .rows import Rows
from .session import PeerTransport
from .steps import relay_round_or_apart
from .transport import Transport, deliver
from .wakeups import due_destinations

logger = logging.getLogger(__name__)

T = TypeVar("T")

# destinations in one round at most: a round's statement stays short, and its locks few
ROUND_DESTINATIONS = 200
# after a round the database could not run: its lanes try again this much later
ROUND_RETRY_SECONDS = 1.0
# a lane another relay's round held: tried again this much later
BUSY_RETRY_SECONDS = 0.05
# how long a relay told to stop waits for its requests in flight to be answered
FINISH_SECONDS = 5.0
# answers that come while the bucket is empty wait this long at most for the claim its
# next tokens allow, and are recorded in that claim's round (well within a lease's margin)
ANSWERS_WAIT_SECONDS = 1.0


class Relay:
    """The relay of one process (the module's docstring). ``transport``, ``database``: a
    harness's network and connection; ``poll_seconds`` None: no poll (a caller that
    wakes lanes itself); ``recoveries``: it steps recovery jobs (recovery.py)."""

    def __init__(
        self,
        *,
        database: Database,
        transport: Callable[[], Transport] = PeerTransport,
        connections: int = 1,
        max_requests: int = 1000,
        poll_seconds: float | None = None,
        heartbeat: Callable[[], object] | None = None,
        heartbeat_seconds: float = 10.0,
        recoveries: bool = False,
    ) -> None:
        self._database = database
        self._make_transport = transport
        self._transport: Transport | None = None
        self._connections = max(1, connections)
        self._max_requests = max(1, max_requests)
        self._poll_seconds = poll_seconds
        self._heartbeat = heartbeat
        self._heartbeat_seconds = heartbeat_seconds
        self._recoveries = recoveries
        self.lanes: dict[int, Lane] = {}
        self._rows = Rows()  # the rows its rounds read, by version (rows.py)
        self._ready: dict[int, None] = {}  # lanes with work for a round, in order
        self._waiting: dict[int, None] = {}  # lanes waiting for the process's room
        self._rounds = 0
        self._requests = 0
        self._reserved = 0
        self._changed: asyncio.Event | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[object]] = set()
        self._unreadable = Unreadable()
        self.answered = 0
        self.last_wait: float | None = None
        self.trouble = DatabaseTrouble(logger)  # one line per stretch (reporting.py)
        self.round_failed = False  # a round failed (relay_destination stops there)

    # --- waking lanes ----------------------------------------------------------------

    def wake(self, destination_id: int) -> None:
        """An admission, the poll or an operator: the destination may have work now."""
        if self._stopping:
            return
        lane = self.lanes.get(destination_id)
        if lane is None:
            lane = self.lanes[destination_id] = Lane(destination_id)
        if lane.timer is not None and lane.for_tokens:
            return  # its timer claims when the bucket allows; nothing can before
        lane.wanted = True
        lane.woken_in_round = lane.in_round
        self._consider(lane)

    def wake_all(self, destination_ids: Iterable[int]) -> None:
        for destination_id in destination_ids:
            self.wake(destination_id)

    def _consider(self, lane: Lane) -> None:
        """Put the lane in the next round if it has work for one; one that wants a claim
        while the process's requests are all in flight waits for one to end."""
        if lane.in_round:
            return
        wants_claim = lane.wanted and not self._stopping and lane.claim_room() > 0
        if wants_claim and not lane.answers and not self._room():
            self._waiting[lane.destination_id] = None
            return
        if lane.answers and not wants_claim and self._tokens_due_soon(lane):
            return  # recorded by the claim its bucket allows in a moment: one round, not two
        if lane.answers or wants_claim:
            self._ready[lane.destination_id] = None
            if self._changed is not None:
                self._changed.set()
        elif lane.idle():
            self.lanes.pop(lane.destination_id, None)

    def _tokens_due_soon(self, lane: Lane) -> bool:
        """The lane's bucket allows its next claim within ANSWERS_WAIT_SECONDS (its
        timer), and the relay is not stopping."""
        timer = lane.timer
        if timer is None or not lane.for_tokens or self._stopping:
            return False
        return timer.when() - asyncio.get_running_loop().time() <= ANSWERS_WAIT_SECONDS

    def _let_waiting_in(self) -> None:
        """Lanes waiting for the process's room, as many as it now has (not all of them
        each time: a thousand lanes may wait at RELAY_MAX_REQUESTS)."""
        for destination_id in list(self._waiting)[: max(0, self._room())]:
            del self._waiting[destination_id]
            if (lane := self.lanes.get(destination_id)) is not None:
                self._consider(lane)

    def _room(self) -> int:
        """Requests this process may still start (RELAY_MAX_REQUESTS)."""
        return self._max_requests - self._requests - self._reserved

    def _wake_at(self, lane: Lane, seconds: float, *, for_tokens: bool = False) -> None:
        loop = asyncio.get_running_loop()
        if lane.timer is not None:
            lane.timer.cancel()
        lane.for_tokens = for_tokens

        def due() -> None:
            lane.timer = None
            lane.for_tokens = False
            if lane.destination_id in self.lanes:
                lane.wanted = True
                self._consider(lane)

        lane.timer = loop.call_later(max(0.0, seconds), due)

    # --- running ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set; then finish (see FINISH_SECONDS)."""
        self._changed = asyncio.Event()
        self._transport = self._make_transport()
        try:
            if self._poll_seconds is not None:
                poll = self._every(self._poll_seconds, due_destinations, "poll", self.wake_all)
                self._spawn(poll)
            if self._heartbeat is not None:
                self._spawn(self._every(self._heartbeat_seconds, self._heartbeat, "heartbeat"))
            if self._recoveries:
                self._spawn(self._every(STEP_SECONDS, recovery_steps, "recovery", self.wake_all))
            self._spawn(self._stopped(stop))
            while not stop.is_set():
                self._start_rounds()
                await self._changed.wait()
                self._changed.clear()
            await self.finish()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._transport.close()

    async def _stopped(self, stop: asyncio.Event) -> None:
        await stop.wait()
        assert self._changed is not None
        self._changed.set()

    async def drain(self, destination_id: int, budget_seconds: float) -> Summary:
        """Relay one destination until it has nothing more now (nothing eligible, its
        limits or breaker stop it, or another relay holds it), or ``budget_seconds``
        have passed; then record what is in flight."""
        self._changed = asyncio.Event()
        self._transport = self._make_transport()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_seconds
        try:
            self.wake(destination_id)
            while True:
                self._start_rounds()
                lane = self.lanes.get(destination_id)
                if self.round_failed and not self._rounds:
                    break  # its answers are left to their leases, as a stopped relay's
                if lane is None or not (
                    lane.in_round
                    or lane.in_flight
                    or lane.answers
                    or self._rounds
                    or destination_id in self._ready
                ):
                    break
                if not self._stopping and loop.time() >= deadline:
                    self._stopping = True  # the budget is spent: record, claim no more
                    self.last_wait = 0.0
                    self._consider(lane)
                    continue
                try:
                    async with asyncio.timeout_at(None if self._stopping else deadline):
                        await self._changed.wait()
                except TimeoutError:
                    continue
                self._changed.clear()
        finally:
            for lane in self.lanes.values():
                if lane.timer is not None:
                    lane.timer.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._transport.close()
        return Summary(self.answered, self.last_wait)

    async def finish(self, seconds: float = FINISH_SECONDS) -> bool:
        """Claim nothing more; wait up to ``seconds`` for the requests in flight and
        record their answers. Returns whether everything was recorded."""
        self._stopping = True
        for lane in list(self.lanes.values()):
            if lane.answers:
                self._consider(lane)  # answers waiting for their bucket's claim go now
        assert self._changed is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._requests or self._ready or self._rounds:
            self._start_rounds()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._changed.wait()
            except TimeoutError:
                break
            self._changed.clear()
        return not (self._requests or self._ready or self._rounds)

    def _spawn(self, coroutine: Awaitable[object]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_rounds(self) -> None:
        while self._ready and self._rounds < self._connections:
            taken, work = [], []
            for destination_id in list(self._ready)[:ROUND_DESTINATIONS]:
                del self._ready[destination_id]
                lane = self.lanes.get(destination_id)
                if lane is None or lane.in_round:
                    continue
                if not lane.answers and self._room() <= 0:
                    # the claims before it took the process's room: it waits for some
                    self._waiting[destination_id] = None
                    continue
                taken.append(lane)
                work.append(self._work(lane))
            if not taken:
                continue
            if not any(w.answers or w.claim for w in work):
                for lane in taken:
                    lane.in_round = False
                    self._consider(lane)
                continue
            self._rounds += 1
            self._spawn(self._round(taken, work))

    def _work(self, lane: Lane) -> Work:
        lane.in_round = True
        claim = 0
        # a round that records answers claims their replacements in the same statement
        if (lane.wanted or lane.answers) and not self._stopping:
            claim = max(0, min(lane.claim_room(), self._room()))
            self._reserved += claim
        answers, lane.answers = lane.answers, []
        return Work(lane.destination_id, answers, claim)

    async def _round(self, lanes: list[Lane], work: list[Work]) -> None:
        try:
            outcomes = await self._database.call(
                lambda: relay_round_or_apart(work, rows=self._rows), "round"
            )
        except Exception as exc:
            self._round_failed(lanes, work, exc)
        else:
            self.trouble.answered()
            for lane, w in zip(lanes, work, strict=True):
                self._apply(lane, w, outcomes.get(lane.destination_id))
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "outbox: a round of %d destination%s: %d claimed, %d answers recorded",
                    len(work),
                    "" if len(work) == 1 else "s",
                    sum(len(o.claimed) for o in outcomes.values()),
                    sum(len(o.recorded) for o in outcomes.values()),
                )
        finally:
            self._reserved -= sum(w.claim for w in work)
            self._rounds -= 1
            self._let_waiting_in()  # what the claims reserved and did not take
            assert self._changed is not None
            self._changed.set()

    def _round_failed(self, lanes: list[Lane], work: list[Work], exc: Exception) -> None:
        """The database could not run the round: its answers wait in memory for the next
        try (their messages stay leased meanwhile), one line per outage."""
        self.round_failed = True
        self.trouble.failed(exc, "outbox: a relay round failed")
        for lane, w in zip(lanes, work, strict=True):
            lane.answers[:0] = list(w.answers)
            lane.in_round = False
            lane.wanted = lane.wanted or bool(w.claim)
            self._wake_at(lane, ROUND_RETRY_SECONDS)
            if lane.answers:
                # to be recorded with the next try, not before
                self._ready.pop(lane.destination_id, None)

    def _apply(self, lane: Lane, work: Work, outcome: Outcome | None) -> None:
        lane.in_round = False
        if outcome is None or outcome.missing:
            self.lanes.pop(lane.destination_id, None)  # no such destination (any longer)
            if lane.timer is not None:
                lane.timer.cancel()
            return
        if outcome.busy:
            # another relay's round held the row: its answers are given again shortly
            lane.answers[:0] = list(work.answers)
            lane.wanted = lane.wanted or bool(work.claim)
            self._wake_at(lane, BUSY_RETRY_SECONDS)
            return
        self.answered += len(outcome.recorded)
        dest = outcome.destination
        lane.destination = dest
        if outcome.unreadable is not None and dest is not None:
            self._unreadable.say(dest, outcome.unreadable)
        if work.claim:
            # a wake-up during the round (an admission its snapshot may not have seen)
            # still wants a claim, unless the limits held the round's claim back
            unheld = outcome.open and outcome.wait is None and outcome.paused_until is None
            lane.wanted = outcome.more or (lane.woken_in_round and unheld)
            self.last_wait = outcome.wait
            if outcome.wait is not None:
                self._wake_at(lane, outcome.wait, for_tokens=True)
            elif outcome.paused_until is not None:
                self._wake_at(lane, (outcome.paused_until - timezone.now()).total_seconds())
        lane.woken_in_round = False
        assert dest is not None
        if outcome.claimed:
            # the sends of a destination's claim, linked to the spans that admitted them
            # (each delivery is that span's child: a trace per event, not per round)
            with tracing.span(
                "webhook.relay_round",
                destination=dest.name,
                messages=len(outcome.claimed),
                links=[m.traceparent for m in outcome.claimed],
            ):
                for message in outcome.claimed:
                    self._send(lane, dest, message)
        self._consider(lane)

    def _send(self, lane: Lane, dest: WebhookDestination, message: Claimed) -> None:
        lane.in_flight += 1
        self._requests += 1
        assert self._transport is not None
        transport = self._transport

        async def send() -> None:
            try:
                sent = await deliver(transport, dest, message)
            finally:
                lane.in_flight -= 1
                self._requests -= 1
            lane.answers.append(sent)
            self.lanes.setdefault(lane.destination_id, lane)
            self._consider(lane)
            self._let_waiting_in()

        self._spawn(send())

    # --- the poll and the heartbeat ----------------------------------------------------

    async def _every(
        self,
        seconds: float,
        fn: Callable[[], T],
        what: str,
        then: Callable[[T], object] = lambda _: None,
    ) -> None:
        """``fn`` on a database thread every ``seconds``, and ``then`` with what it
        returned (the poll wakes what it found); a failure is the database's, logged once
        an outage."""
        while True:
            try:
                found = await self._database.call(fn, what)
            except Exception as exc:
                self.trouble.failed(exc, f"outbox: the relay's {what} failed")
            else:
                then(found)
            await asyncio.sleep(seconds)
