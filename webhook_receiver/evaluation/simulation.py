"""The simulation: one scenario run through the app's real code, in simulated time.

Two things are simulated. The clock: ``time-machine`` freezes the wall clock
(``time.time``, ``datetime.now``) at a simulated instant, and the relay runs on an event
loop whose time is the same simulated clock (runtime.py): when nothing is ready, the
clock moves to the next thing due, so an hour of traffic runs in seconds and a run is
the same on every machine. The network: the relay's requests go through its transport
(``world.SimulatedTransport``), whose merchants (world.py) answer as the scenario says,
after the simulated time they say. Everything above the socket is the production code:
``enqueue_webhook`` in a transaction, the relay's engine (its lanes, rounds, poll and
timers), its claim, limiter, signing, recording and breaker, ``webhook_receive`` and its
claim, the failed-event retry sweep and the silence check, and an operator's recovery
job (``recovery_start``, and the relays' steps of it: recoveries.py).

The relay processes are the scenario's ``relay.processes`` engines, on the run's one
loop; an admission wakes them once it commits, as PostgreSQL's notification does, and
each polls every ``relay.poll``. Beat's tasks run at the scenario's intervals. Every
piece of database work, the relay's included, is done on the run's own thread (its
connection, its statements counted by phase) while the loop waits: only one thing
happens at a time, so a run stays deterministic.
"""

from __future__ import annotations

import asyncio
import io
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import time_machine
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from .. import schemes, signals
from ..core import seam
from ..inbound.failures import retry_failed_events
from ..inbound.models import FailedEvent
from ..inbound.receive import webhook_receive
from ..outbound.admission import enqueue_webhook
from ..outbound.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from ..outbound.operations import destination_enable
from ..outbound.relay.engine import Relay
from ..outbound.relay.steps import relay_claim
from ..outbound.relay.transport import deliver
from ..outbound.tenancy import EVERY_TENANT
from ..watch.destinations import destination_statuses
from ..watch.silence import check_silence
from . import recoveries, traffic, world
from .backlog import Backlog
from .inputs import Scenario
from .observed import Observations
from .runtime import RunDatabase, SimulatedLoop
from .settings import EVENT_TYPE, SENDER, beat_schedule, eval_settings, sender_secret

T = TypeVar("T")

# samples of queue depth, oldest age and the status's judgement per run, whatever its
# length (the built-in scenarios' figures count them)
SAMPLES = 240
# the status's judgements of a backlog recorded at each sample (watch/conditions.py)
JUDGED = ("relay_not_sending", "behind")
# the message's columns a run keeps
COLUMNS = ("id", "destination_id", "key", "event_type", "ordering_key", "status", "attempts",
           "failures", "created_at", "delivered_at", "last_error", "last_status_code",
           "metadata", "recovery_id")  # fmt: skip


class Simulation:
    def __init__(self, scenario: Scenario, *, seed: int, samples: int = SAMPLES) -> None:
        self.scenario = scenario
        self.seed = seed
        self.samples = samples
        self.phase = "other"  # what the statements of the work in hand count for
        self.obs = Observations(scenario=scenario, seed=seed, cut_off=scenario.duration)
        self._start = scenario.start
        self._traveller: Any = None
        self._destinations: dict[str, WebhookDestination] = {}
        self._names: dict[int, str] = {}
        self._database = RunDatabase(self)
        self._event_loop: SimulatedLoop | None = None
        self._relays: list[Relay] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failures: list[BaseException] = []
        self.network = world.Network(
            {
                spec.name: world.Merchant(
                    spec, secret=sender_secret(seed, spec.name), seed=seed, clock=self.now
                )
                for spec in scenario.destinations
            }
        )

    # --- the clock ---

    def now(self) -> float:
        """Simulated seconds since the scenario's start, to the microsecond (the clock
        moves in whole microseconds; a float epoch carries about 0.2 µs of noise)."""
        return round(time.time() - self._start.timestamp(), 6)

    def _move_to(self, offset: float) -> None:
        self._traveller.move_to(self._start + timedelta(seconds=round(offset, 6)))

    def _transport(self) -> world.SimulatedTransport:
        return world.SimulatedTransport(self.network, self.now)

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
                    with connection.execute_wrapper(self._count_statement):
                        self._database.serve(self._loop, stop=self._stop_loop)
                    self._move_to(self.scenario.duration)
                    self.phase = "collect"
                    self._collect()
            finally:
                signals.silence_alert_opened.disconnect(self._silence_opened)
                signals.silence_alert_resolved.disconnect(self._silence_resolved)
        if self._failures:
            raise self._failures[0]
        self.obs.wall_seconds = time.perf_counter() - began
        return self.obs

    def _patched(self) -> ExitStack:
        """Beat's schedule as the scenario's intervals (which the status's pickup reads:
        watch/pickup.py), and through the seam (core/seam.py) the retry jitter drawn
        from the seed."""
        stack = ExitStack()
        beat = self.scenario.beat
        schedule = {
            "retry": {"task": "webhook_receiver.retry_failed_events", "schedule": beat.retry_sweep},
        }
        stack.enter_context(beat_schedule(schedule))
        stack.enter_context(seam.replaced(rng=random.Random(self.seed)))
        return stack

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

    def _happenings(self) -> list[tuple[float, str, Any]]:
        """What the scenario makes happen, and when (beat's tasks and the samples recur
        on their own)."""
        s = self.scenario
        found: list[tuple[float, str, Any]] = []
        found += traffic.admissions(s, self.seed)
        found += traffic.inbound(s, self.seed, world.current_receiver)
        found += [(crash.at, "crash", crash) for crash in s.crashes]
        found += [
            (d.enable_at, "enable", d.name) for d in s.destinations if d.enable_at is not None
        ]
        found += recoveries.happenings(s)
        return found

    def _loop(self) -> None:
        """The run's event loop, on its own thread (the database work comes back to the
        run's thread: RunDatabase)."""
        loop = self._event_loop = SimulatedLoop(self.now, self._move_to)
        try:
            loop.run_until_complete(self._main())
        finally:
            # stopped from outside (an interruption): what still runs ends here
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def _stop_loop(self) -> None:
        """The run interrupted (Ctrl-C, SIGTERM): its loop stops where it is."""
        loop = self._event_loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.scenario
        stop = asyncio.Event()
        runs: list[asyncio.Task[Any]] = []
        if s.destinations:
            self._relays = [
                Relay(
                    database=self._database,
                    transport=self._transport,
                    poll_seconds=s.relay.poll,
                    recoveries=recoveries.wanted(s),
                )
                for _ in range(s.relay.processes)
            ]
            runs = [asyncio.ensure_future(relay.run(stop)) for relay in self._relays]
        for at, kind, payload in self._happenings():
            loop.call_at(at, self._spawn, self._happen, kind, payload)
        if s.inbound is not None:
            self._spawn(self._every, s.beat.retry_sweep, "retry_sweep", retry_failed_events)
            self._spawn(self._every, s.beat.silence_check, "silence", check_silence)
        self._spawn(self._every, max(1.0, s.duration / self.samples), "sample", self._sample)
        await asyncio.sleep(s.duration)
        # the cut-off: what is on its way stays as it is, as on a machine switched off
        for task in [*runs, *self._tasks]:
            task.cancel()
        for outcome in await asyncio.gather(*runs, *self._tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                self._failures.append(outcome)

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        task = asyncio.ensure_future(fn(*args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failures.append(task.exception())  # type: ignore[arg-type]

    async def _every(self, interval: float, phase: str, fn: Callable[[], object]) -> None:
        """Beat's task (or the sampling) at its interval from the start, whether or not
        the last one is done."""
        while True:
            await self._database.call(fn, phase)
            await asyncio.sleep(interval)

    async def _happen(self, kind: str, payload: Any) -> None:
        if kind == "admit":
            created = await self._database.call(lambda: self._admit(payload), "admit")
            self._wake(await self._database.call(lambda: self._notified(created), "notify"))
        elif kind == "inbound":
            await self._database.call(lambda: self._post(payload), "inbound")
        elif kind == "crash":
            await self._crash(payload)
        elif kind == "enable":
            enable = partial(destination_enable, destination=self._destinations[payload])
            held = await self._database.call(lambda: enable(scope=EVERY_TENANT, by="ops"), "enable")
            self.obs.enables.append({"at": self.now(), "destination": payload, "held": held})
            self._wake([payload])
        elif kind == "recover":
            start = partial(recoveries.start, self.obs, self._destinations[payload], self._start)
            await self._database.call(start, "recovery")
            self._wake([payload])  # a job ends an open breaker's pause

    def _notified(self, names: list[str]) -> list[str]:
        """Of the destinations an admission created a message for, those its insert
        notifies on PostgreSQL (queries.INSERT_MESSAGE): the ones its breaker has not
        paused. Asked of the database on both engines, so that their runs are the same
        (its statement counts for no phase the report shows)."""
        now = timezone.now()
        ids = {self._destinations[name].pk: name for name in names}
        awake = WebhookDestination.objects.filter(pk__in=ids).filter(
            Q(paused_until__isnull=True) | Q(paused_until__lte=now)
        )
        return sorted(ids[pk] for pk in awake.values_list("pk", flat=True))

    def _wake(self, names: list[str]) -> None:
        """What an admission's notification does once it commits: each relay's lane of
        the destination is woken."""
        for name in names:
            for relay in self._relays:
                relay.wake(self._destinations[name].pk)

    def _count_statement(self, execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        # the transaction's bounds (PostgreSQL's set_config) are not work of their own
        if not sql.lstrip().upper().startswith("SELECT SET_CONFIG"):
            self.obs.statements[self.phase] += 1
        return execute(sql, *args)

    def _admit(self, item: dict[str, Any]) -> list[str]:
        """One business transaction admitting the event to each destination; returns
        the destinations it created a message for."""
        created = []
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
                if admission.created:
                    created.append(name)
        return created

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

    async def _crash(self, crash: Any) -> None:
        """A relay claims, maybe sends, and dies before it records anything: its
        messages stay leased until the lease runs out."""
        dest = self._destinations[crash.destination]
        outcome = await self._database.call(lambda: relay_claim(destination=dest), "crash")
        self.obs.crashes.append(
            {
                "at": self.now(),
                "destination": crash.destination,
                "after": crash.after,
                "keys": [m.key for m in outcome.claimed],
            }
        )
        if crash.after == "send":
            transport = self._transport()
            sent = outcome.destination or dest
            for message in outcome.claimed:
                self._spawn(deliver, transport, sent, message)

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
        obs = self.obs
        for values in OutboxMessage.objects.order_by("id").values(*COLUMNS):
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
        recoveries.collect(obs, self._start)


def _offset(moment: datetime, start: datetime) -> float:
    return round((moment - start).total_seconds(), 6)
