"""The worker processes and relay lanes of a simulated run: threads, each with a
database connection of its own, of which exactly one runs at a time.

A worker process takes due tasks first come, first served, one at a time, as a prefork
process does; its relay tasks hand their destinations to its lanes (``RelayLanes``, the
production class, given a way to start a lane here), and a lane thread runs them. A
thread that waits for the clock (an answer on its way: ``hold``) gives the turn back;
the schedule wakes it when the clock gets there. The schedule hands the turn to one
thread and waits until every thread waits again (``settle``): a run stays
deterministic, whatever the operating system's scheduler does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connection

from ..outbound.relay.lanes import RelayLanes

# real seconds the schedule waits for the threads to settle before it gives up
SETTLE_SECONDS = 300.0


class Stop(BaseException):
    """Ends a worker thread held by an answer at the cut-off (nothing may catch it)."""


class SimThread:
    """A thread of the simulation: a worker process's (one task at a time), or a relay
    lane's (one destination's runs, started by a worker process's task)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.task: tuple[str, Any] | None = None
        self.resume = threading.Event()
        self.thread: threading.Thread | None = None
        self.lanes: RelayLanes | None = None  # a worker process's relay lanes
        self.lane_target: Callable[[], None] | None = None  # a lane thread's lane to run

    def wait_turn(self) -> None:
        """Wait until the schedule hands this thread the turn."""
        self.resume.wait()
        self.resume.clear()


class Processes:
    """The run's worker processes (``workers`` of them) and the lanes they start."""

    def __init__(
        self,
        *,
        workers: int,
        run_task: Callable[[str, Any], None],
        run_lane: Callable[[int], object],
        wake_at: Callable[[float, SimThread], None],
        now: Callable[[], float],
        count_statement: Callable[..., Any],
        local: threading.local,
    ) -> None:
        self._count = workers
        self._run_task = run_task
        self._run_lane = run_lane
        self._wake_at = wake_at
        self._now = now
        self._count_statement = count_statement
        self._local = local  # the thread's SimThread and the phase its statements count for
        self._settled = threading.Condition()
        self._running = 0
        self._workers: list[SimThread] = []
        self._lanes: list[SimThread] = []
        self._idle_lanes: list[SimThread] = []
        self._idle: deque[SimThread] = deque()
        self._due_tasks: deque[tuple[str, Any]] = deque()
        self._worker_error: BaseException | None = None
        self._stopping = False

    def start(self) -> None:
        for number in range(self._count):
            worker = SimThread(f"eval-worker-{number}")
            worker.lanes = RelayLanes(start=self._start_lane, run=self._run_lane)
            worker.thread = threading.Thread(
                target=self._work, args=(worker,), name=worker.name, daemon=True
            )
            self._workers.append(worker)
            self._idle.append(worker)
            worker.thread.start()

    def _work(self, worker: SimThread) -> None:
        """A worker's life: wait for a task, run it (held while its answers take time),
        then take the next due task, or wait idle."""
        self._local.worker = worker
        try:
            with connection.execute_wrapper(self._count_statement):
                while True:
                    worker.wait_turn()
                    task = worker.task
                    if task is None:
                        return
                    while task is not None:
                        self._local.phase = task[0]
                        if not self._survives(partial(self._run_task, *task)):
                            return
                        with self._settled:
                            task = self._due_tasks.popleft() if self._due_tasks else None
                            if task is None:
                                worker.task = None
                                self._idle.append(worker)
                                self._turn_given_back()
        finally:
            connection.close()

    def _survives(self, run: Callable[[], object]) -> bool:
        """Run a task or a lane on this thread: False when the cut-off stops the thread;
        any other error is kept for ``settle`` to raise."""
        try:
            run()
        except Stop:
            return False
        except BaseException as exc:  # the schedule raises it
            self._worker_error = self._worker_error or exc
        return True

    def submit(self, kind: str, payload: Any) -> None:
        """A task reaches the broker: an idle worker takes it now, else it waits its turn."""
        with self._settled:
            if not self._idle:
                self._due_tasks.append((kind, payload))
                return
            worker = self._idle.popleft()
            worker.task = (kind, payload)
            self._give_turn(worker)
        self.settle()

    def wake(self, worker: SimThread) -> None:
        with self._settled:
            self._give_turn(worker)
        self.settle()

    def _give_turn(self, thread: SimThread) -> None:
        """``thread`` runs until it waits again (holding ``_settled``)."""
        self._running += 1
        thread.resume.set()

    def _turn_given_back(self) -> None:
        """The calling thread waits again (holding ``_settled``): once none runs,
        ``settle`` returns."""
        self._running -= 1
        self._settled.notify_all()

    def settle(self) -> None:
        """Wait until every worker waits for the clock or for work."""
        with self._settled:
            if not self._settled.wait_for(lambda: self._running == 0, SETTLE_SECONDS):
                raise RuntimeError(f"the worker threads did not settle in {SETTLE_SECONDS:g} s")
        if self._worker_error is not None:
            error, self._worker_error = self._worker_error, None
            raise error

    def hold(self, seconds: float) -> None:
        """The calling thread waits ``seconds`` of simulated time (an answer on its way)."""
        worker: SimThread = self._local.worker
        self._wake_at(round(self._now() + seconds, 6), worker)
        with self._settled:
            self._turn_given_back()
        worker.wait_turn()
        if self._stopping:
            raise Stop

    def _start_lane(self, target: Callable[[], None], name: str) -> None:
        """A relay lane, as RelayLanes starts one: on an idle lane thread (kept, with its
        connection, as the process's pool keeps them) or a new one. It runs once the
        task that started it is done (one thread at a time), at the same instant."""
        lane = self._idle_lanes.pop() if self._idle_lanes else None
        if lane is None:
            lane = SimThread(f"eval-lane-{len(self._lanes)}")
            lane.thread = threading.Thread(
                target=self._lane, args=(lane,), name=lane.name, daemon=True
            )
            self._lanes.append(lane)
            lane.thread.start()
        lane.lane_target = target
        self._wake_at(self._now(), lane)

    def _lane(self, lane: SimThread) -> None:
        """A lane thread's life: wait to be woken with a lane to run, run it (held while
        its answers take time), then wait idle for the next."""
        self._local.worker = lane
        self._local.phase = "relay"
        try:
            with connection.execute_wrapper(self._count_statement):
                while True:
                    lane.wait_turn()
                    target = lane.lane_target
                    if self._stopping or target is None:
                        return
                    if not self._survives(target):
                        return
                    with self._settled:
                        lane.lane_target = None
                        self._idle_lanes.append(lane)
                        self._turn_given_back()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stopping = True
        for worker in [*self._workers, *self._lanes]:
            worker.task = None
            worker.lane_target = None
            worker.resume.set()
        for worker in [*self._workers, *self._lanes]:
            if worker.thread is not None:
                worker.thread.join(timeout=SETTLE_SECONDS)
