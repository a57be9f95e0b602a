"""The simulation: one scenario run through the app's real code, in simulated time.

Two things are simulated. The clock: ``time-machine`` freezes the wall clock
(``time.time``, ``datetime.now``) at a simulated instant, the relay's run budget reads
the same simulated seconds (``relay_run``'s ``clock``), and the run moves the clock from
one scheduled happening to the next, so an hour of traffic runs in seconds and a run is
the same on every machine. The network: a relay run's requests go through its
``window`` (``world.SimulatedWindow``), an ``httpx.MockTransport`` whose merchants
(world.py) answer as the scenario says. Everything above the socket is the production
code: ``enqueue_webhook`` in a transaction, the relay's claim, limiter, signing,
recording and breaker (``relay_run``, as the ``relay_destination`` task runs it), the
beat sweep, ``webhook_receive`` and its claim, the failed-event retry sweep and the
silence check.

The broker is played by the run's schedule: a task the code queues (a relay run on an
admission's commit, a follow-up when a bucket is empty, the sweep's) is due at the
simulated time its countdown names, and beat's tasks at their intervals. The worker
processes are the scenario's ``workers``: threads, each with a connection of its own,
that take due tasks first come, first served, one at a time, as prefork processes do; a
relay task hands its destination to a lane of that process (relay/lanes.py), a thread of
the simulation's too. An answer takes the simulated time its merchant says (a delay; a
timeout lasts the destination's timeout): the lane that waits for it is held that long,
and records the answers that have come while the others are on their way.
Only one thread runs at a time (the others wait for the clock), so a run stays
deterministic.
"""

from __future__ import annotations

import heapq
import io
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import Any

import time_machine
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction

from .. import schemes, signals
from ..core import seam
from ..inbound.failures import failed_events_retry_due
from ..inbound.models import FailedEvent
from ..inbound.receive import webhook_receive
from ..outbound import trigger
from ..outbound.admission import enqueue_webhook
from ..outbound.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from ..outbound.operations import destination_enable
from ..outbound.relay.claim import relay_claim
from ..outbound.relay.run import relay_run
from ..watch.destinations import destination_statuses
from ..watch.silence import silence_check
from . import traffic, world
from .backlog import Backlog
from .inputs import Scenario
from .observed import Observations
from .processes import Processes
from .settings import EVENT_TYPE, SENDER, beat_schedule, eval_settings, sender_secret

# samples of queue depth, oldest age and the status's judgement per run, whatever its
# length (the built-in scenarios' figures count them)
SAMPLES = 240
# the status's judgements of a backlog recorded at each sample (watch/conditions.py)
JUDGED = ("relay_not_sending", "behind")
# the tasks a worker process runs (the rest happen in the web process or the sender)
WORKER_TASKS = frozenset({"relay", "sweep", "retry_sweep", "silence"})


class Simulation:
    def __init__(self, scenario: Scenario, *, seed: int, samples: int = SAMPLES) -> None:
        self.scenario = scenario
        self.seed = seed
        self.samples = samples
        self._queue: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()
        self._relays_queued: set[tuple[int, float]] = set()
        self._local = threading.local()  # the phase a thread's statements count for
        # a worker thread queues its follow-ups on the schedule too
        self._queue_lock = threading.Lock()
        self.processes = Processes(
            workers=scenario.workers,
            run_task=self._run_task,
            run_lane=self._relay_run,
            wake_at=lambda when, thread: self.at(when, "wake", thread),
            now=self.now,
            count_statement=self._count_statement,
            local=self._local,
        )
        self.obs = Observations(scenario=scenario, seed=seed, cut_off=scenario.duration)
        self._start = scenario.start
        self._traveller: Any = None
        self._destinations: dict[str, WebhookDestination] = {}
        self._names: dict[int, str] = {}
        self.network = world.Network(
            {
                spec.name: world.Merchant(
                    spec, secret=sender_secret(seed, spec.name), seed=seed, clock=self.now
                )
                for spec in scenario.destinations
            }
        )

    # --- the clock and the schedule ---

    def now(self) -> float:
        """Simulated seconds since the scenario's start, to the microsecond (the clock
        moves in whole microseconds; a float epoch carries about 0.2 µs of noise)."""
        return round(time.time() - self._start.timestamp(), 6)

    def at(self, offset: float, kind: str, payload: Any = None) -> None:
        with self._queue_lock:
            heapq.heappush(self._queue, (offset, next(self._order), kind, payload))

    def _queue_relay(self, destination_id: int, countdown: float | None) -> None:
        when = round(self.now() + (countdown or 0.0), 6)
        # a run queued for the same destination and instant would find nothing more
        if (destination_id, when) not in self._relays_queued:
            self._relays_queued.add((destination_id, when))
            self.at(when, "relay", destination_id)

    # --- the run ---

    def run(self) -> Observations:
        began = time.perf_counter()
        with eval_settings(self.scenario, self.seed), self._patched():
            self._reset()
            signals.silence_alert_opened.connect(self._silence_opened, weak=False)
            signals.silence_alert_resolved.connect(self._silence_resolved, weak=False)
            try:
                with time_machine.travel(self._start, tick=False) as traveller:
                    self._traveller = traveller
                    self._setup()
                    self.processes.start()
                    try:
                        self._loop()
                        self._collect()
                    finally:
                        self.processes.stop()
            finally:
                signals.silence_alert_opened.disconnect(self._silence_opened)
                signals.silence_alert_resolved.disconnect(self._silence_resolved)
        self.obs.wall_seconds = time.perf_counter() - began
        return self.obs

    def _run_task(self, kind: str, payload: Any) -> None:
        if kind == "relay":
            # as the relay_destination task does: the run goes on in the destination's
            # lane, a thread of this worker process
            lanes = self._local.worker.lanes
            assert lanes is not None
            lanes.relay(payload)
        elif kind == "sweep":
            trigger.outbox_sweep()
        elif kind == "retry_sweep":
            failed_events_retry_due()
        elif kind == "silence":
            silence_check()

    def _patched(self) -> ExitStack:
        """The broker's place taken by the schedule, and beat's by the scenario's
        intervals (which the status's pickup reads: watch/pickup.py). Through the seam
        (core/seam.py): the relay runs the code starts go on the schedule, the retry
        jitter draws from the seed, and the process's state (the storm detector) is the
        run's own."""
        stack = ExitStack()
        beat = self.scenario.beat
        schedule = {
            "sweep": {"task": "webhook_receiver.relay_sweep", "schedule": beat.relay_sweep},
            "retry": {"task": "webhook_receiver.retry_failed_events", "schedule": beat.retry_sweep},
        }
        stack.enter_context(beat_schedule(schedule))
        stack.enter_context(seam.replaced(relay=self._queue_relay, rng=random.Random(self.seed)))
        return stack

    def _window(self) -> world.SimulatedWindow:
        return world.SimulatedWindow(self.network, self.now, self.processes.hold)

    def _relay_run(self, destination_id: int) -> int:
        """A lane's run: its requests go to the merchants and take the time they say, and
        its budget is in the same simulated seconds (time-machine leaves time.monotonic
        running)."""
        return relay_run(destination_id, window=self._window(), clock=self.now)

    def _reset(self) -> None:
        call_command("flush", interactive=False, verbosity=0)
        world.Receiver.create_table()
        cache.clear()
        world.current_receiver.reset()

    def _setup(self) -> None:
        s = self.scenario
        event_types = sorted({f"order.{e}" for a in s.admissions for e in a.events})
        for spec in s.destinations:
            secret = sender_secret(self.seed, spec.name)
            dest = WebhookDestination.objects.create(
                name=spec.name,
                url=world.Network.url(spec.name),
                secrets=[secret],
                event_types=event_types,
                rate_count=spec.rate_count,
                rate_seconds=spec.rate_seconds,
                burst=spec.burst,
                max_in_flight=spec.max_in_flight,
                timeout_seconds=spec.timeout_seconds,
                max_attempts=spec.max_attempts,
                backoff_base_seconds=spec.backoff_base_seconds,
                backoff_cap_seconds=spec.backoff_cap_seconds,
                retry_after_cap_seconds=spec.retry_after_cap_seconds,
                breaker_threshold=spec.breaker_threshold,
                breaker_cooldown_seconds=spec.breaker_cooldown_seconds,
            )
            self._destinations[spec.name] = dest
            self._names[dest.pk] = spec.name
            self.obs.arrivals[spec.name] = []
            self.obs.samples[spec.name] = []
        for at, kind, payload in traffic.admissions(s, self.seed):
            self.at(at, kind, payload)
        for at, kind, payload in traffic.inbound(s, self.seed, world.current_receiver):
            self.at(at, kind, payload)
        for crash in s.crashes:
            self.at(crash.at, "crash", crash)
        for spec in s.destinations:
            if spec.enable_at is not None:
                self.at(spec.enable_at, "enable", spec.name)
        if s.destinations:
            self.at(0.0, "sweep")
        if s.inbound is not None:
            self.at(0.0, "retry_sweep")
            self.at(0.0, "silence")
        self.at(0.0, "sample")

    def _loop(self) -> None:
        counting = connection.execute_wrapper(self._count_statement)
        with counting:
            while True:
                with self._queue_lock:
                    if not self._queue or self._queue[0][0] > self.scenario.duration:
                        break
                    offset, _, kind, payload = heapq.heappop(self._queue)
                self._traveller.move_to(self._start + timedelta(seconds=offset))
                self._local.phase = kind
                self._do(kind, payload)
                self._local.phase = "other"
            self._traveller.move_to(self._start + timedelta(seconds=self.scenario.duration))

    def _count_statement(self, execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        # the transaction's bounds (PostgreSQL's set_config) are not work of their own
        if not sql.lstrip().upper().startswith("SELECT SET_CONFIG"):
            self.obs.statements[getattr(self._local, "phase", "other")] += 1
        return execute(sql, *args)

    def _do(self, kind: str, payload: Any) -> None:
        beat = self.scenario.beat
        if kind == "wake":
            self.processes.wake(payload)
        elif kind == "admit":
            self._admit(payload)
        elif kind == "relay":
            self._relays_queued.discard((payload, round(self.now(), 6)))
            self.processes.submit(kind, payload)
        elif kind in WORKER_TASKS:
            # beat sends the task at its interval, whether or not a worker is free
            interval = {"sweep": beat.relay_sweep, "retry_sweep": beat.retry_sweep}.get(
                kind, beat.silence_check
            )
            self.at(self.now() + interval, kind)
            self.processes.submit(kind, payload)
        elif kind == "inbound":
            self._post(payload)
        elif kind == "crash":
            self._crash(payload)
        elif kind == "enable":
            held = destination_enable(destination=self._destinations[payload], by="operator")
            self.obs.enables.append({"at": self.now(), "destination": payload, "held": held})
        elif kind == "sample":
            self._sample()
            self.at(self.now() + max(1.0, self.scenario.duration / self.samples), "sample")

    def _admit(self, item: dict[str, Any]) -> None:
        """One business transaction admitting the event to each destination."""
        with transaction.atomic():
            for name in item["targets"]:
                admission = enqueue_webhook(
                    self._destinations[name],
                    f"order.{item['event']}",
                    item["key"],
                    {
                        "id": item["key"],
                        "type": f"order.{item['event']}",
                        "order_id": item["order_id"],
                    },
                    ordering_key=item["ordering_key"],
                    metadata=item["metadata"] or None,
                )
                self.obs.admissions.append(
                    {
                        "at": self.now(),
                        "destination": name,
                        "key": item["key"],
                        "repeat": bool(item.get("repeat")),
                        "created": admission.created,
                        "coalesced": admission.coalesced,
                    }
                )

    def _post(self, item: dict[str, Any]) -> None:
        """The sender posts one signed event (its first delivery, or a redelivery)."""
        key = item["key"]
        body = (
            f'{{"type":"{EVENT_TYPE}","id":"{key}","created":{self.now():.3f},'
            f'"data":{{"order_id":"{key}"}}}}'
        ).encode()
        headers = schemes.sign(
            scheme="standard",
            secret=sender_secret(self.seed, SENDER),
            body=body,
            message_id=key,
            timestamp=int(time.time()),
        )
        headers["content-type"] = "application/json"
        outcome = webhook_receive(
            source_slug=SENDER,
            stream=io.BytesIO(body),
            content_length=len(body),
            headers=headers,
            remote_addr="192.0.2.10",
        )
        self.obs.inbound_sent.append(
            {
                "at": self.now(),
                "key": key,
                "first": bool(item.get("first")),
                "status": str(outcome.status),
            }
        )

    def _silence_opened(self, sender: Any, **kwargs: Any) -> None:
        self.obs.silence.append({"at": self.now(), "note": "opened"})

    def _silence_resolved(self, sender: Any, **kwargs: Any) -> None:
        self.obs.silence.append({"at": self.now(), "note": "resolved"})

    def _crash(self, crash: Any) -> None:
        """The relay claims, maybe sends, and dies before it records anything: its
        messages stay leased until the lease runs out."""
        dest = self._destinations[crash.destination]
        round_ = relay_claim(destination=dest)
        if crash.after == "send":
            self._window().start(dest, round_.claimed)
        self.obs.crashes.append(
            {
                "at": self.now(),
                "destination": crash.destination,
                "after": crash.after,
                "keys": [m.key for m in round_.claimed],
            }
        )

    def _sample(self) -> None:
        now = self.now()
        moment = self._start + timedelta(seconds=now)
        # the app's own judgement at the same moment (what webhook_status would say)
        judged = {d.name: d.reasons for d in destination_statuses(now=moment)}
        for name, dest in self._destinations.items():
            queue = Backlog(dest, moment)
            self.obs.samples[name].append(
                (now, queue.open, queue.eligible_age, len(queue.held), queue.held_age)
            )
            codes = [r.code for r in judged.get(name, ()) if r.code in JUDGED]
            self.obs.judged.setdefault(name, []).append((now, codes[0] if codes else ""))

    # --- what the run left ---

    def _collect(self) -> None:
        self._local.phase = "collect"
        obs = self.obs
        rows = OutboxMessage.objects.order_by("id").values(
            "id",
            "destination_id",
            "key",
            "event_type",
            "ordering_key",
            "status",
            "attempts",
            "failures",
            "created_at",
            "delivered_at",
            "last_error",
            "last_status_code",
            "metadata",
        )
        for values in rows:
            row: dict[str, Any] = dict(values)
            row["destination"] = self._names.get(row["destination_id"], "?")
            row["created"] = _offset(row.pop("created_at"), self._start)
            delivered = row.pop("delivered_at")
            row["delivered"] = _offset(delivered, self._start) if delivered else None
            obs.messages.append(row)
        for attempt in DeliveryAttempt.objects.order_by("message_id", "number").values(
            "message_id", "number", "started_at", "status_code", "error", "next_attempt_at"
        ):
            a: dict[str, Any] = dict(attempt)
            a["started"] = _offset(a.pop("started_at"), self._start)
            nxt = a.pop("next_attempt_at")
            a["next"] = _offset(nxt, self._start) if nxt else None
            obs.attempts.setdefault(a["message_id"], []).append(a)
        cut_off = self._start + timedelta(seconds=self.scenario.duration)
        for name, dest in self._destinations.items():
            obs.held_back[name] = Backlog(dest, cut_off).held_behind()
        for name, merchant in self.network.merchants.items():
            obs.arrivals[name] = list(merchant.arrivals)
            obs.merchant_effects[name] = Counter(merchant.effects)
            obs.max_concurrency[name] = merchant.max_in_flight
        if self.scenario.inbound is not None:
            obs.inbound_effects = world.Receiver.effects()
            obs.inbound_failed = dict(
                FailedEvent.objects.filter(source=SENDER).values_list("event_key", "status")
            )


def _offset(moment: datetime, start: datetime) -> float:
    return round((moment - start).total_seconds(), 6)
