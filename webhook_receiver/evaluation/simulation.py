"""The simulation: one scenario run through the app's real code, in simulated time.

Two things are simulated. The clock: ``time-machine`` freezes every clock Python has
(``time.time``, ``datetime.now``, ``time.monotonic``) at a simulated instant, and the
run moves it from one scheduled happening to the next, so an hour of traffic runs in
seconds and a run is the same on every machine. The network: the relay's HTTP client is
given an ``httpx.MockTransport`` (``relay.transport.simulated_network``) whose merchants
(world.py) answer as the scenario says. Everything above the socket is the production
code: ``enqueue_webhook`` in a transaction, the relay's claim, limiter, signing,
recording and breaker (``relay_run``, as the ``relay_destination`` task runs it), the
beat sweep, ``webhook_receive`` and its claim, the failed-event retry sweep and the
silence check.

The broker is played by the run's schedule: a task the code queues (a relay run on an
admission's commit, a follow-up when a bucket is empty, the sweep's) runs at the
simulated time its countdown names, and beat's tasks run at their intervals.
"""

from __future__ import annotations

import heapq
import io
import itertools
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import time_machine
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Q

from .. import schemes, signals, tasks
from ..core import backoff
from ..inbound import claim as inbound_claim
from ..inbound.failures import failed_events_retry_due
from ..inbound.models import FailedEvent
from ..inbound.receive import webhook_receive
from ..outbound import trigger
from ..outbound.admission import enqueue_webhook, message_key
from ..outbound.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from ..outbound.relay import claim as relay_claim_module
from ..outbound.relay.run import relay_run
from ..outbound.relay.transport import relay_send, simulated_network
from ..watch.silence import silence_check
from . import world
from .scenario import Scenario
from .settings import EVENT_TYPE, SENDER, eval_settings, sender_secret

# samples of queue depth and oldest age per run, whatever its length
SAMPLES = 240


@dataclass
class Observations:
    """What one run left: the scheduled admissions, the database's rows at the cut-off,
    each merchant's arrivals and effects, the receiver's side, and the samples."""

    scenario: Scenario
    seed: int
    cut_off: float
    admissions: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    arrivals: dict[str, list[world.Arrival]] = field(default_factory=dict)
    merchant_effects: dict[str, Counter[str]] = field(default_factory=dict)
    max_concurrency: dict[str, int] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    inbound_sent: list[dict[str, Any]] = field(default_factory=list)
    inbound_effects: Counter[str] = field(default_factory=Counter)
    inbound_failed: dict[str, str] = field(default_factory=dict)
    silence: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)
    statements: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0


class Simulation:
    def __init__(self, scenario: Scenario, *, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self._queue: list[tuple[float, int, str, Any]] = []
        self._order = itertools.count()
        self._relays_queued: set[tuple[int, float]] = set()
        self._phase = "setup"
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
        heapq.heappush(self._queue, (offset, next(self._order), kind, payload))

    def _queue_relay(self, destination_id: int, countdown: float | None) -> None:
        when = round(self.now() + (countdown or 0.0), 6)
        # a run queued for the same destination and instant would find nothing more
        if (destination_id, when) not in self._relays_queued:
            self._relays_queued.add((destination_id, when))
            self.at(when, "relay", destination_id)

    def _queue_task(self, args: tuple[Any, ...] = (), kwargs: Any = None, **options: Any) -> None:
        """``relay_destination.apply_async`` as the code calls it, countdown included."""
        self._queue_relay(args[0], options.get("countdown"))

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
                    self._loop()
                    self._collect()
            finally:
                signals.silence_alert_opened.disconnect(self._silence_opened)
                signals.silence_alert_resolved.disconnect(self._silence_resolved)
        self.obs.wall_seconds = time.perf_counter() - began
        return self.obs

    def _patched(self) -> ExitStack:
        """The broker's place taken by the schedule, and the network by the merchants."""
        stack = ExitStack()
        stack.enter_context(
            mock.patch.multiple(
                tasks.relay_destination,
                apply_async=self._queue_task,
                delay=lambda destination_id: self._queue_relay(destination_id, None),
            )
        )
        stack.enter_context(simulated_network(self.network.transport))
        return stack

    def _reset(self) -> None:
        call_command("flush", interactive=False, verbosity=0)
        world.Receiver.create_table()
        cache.clear()
        inbound_claim.duplicate_share.reset()
        world.current_receiver.reset()
        backoff.jitter.seed(self.seed)  # the production code's retry jitter

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
        self._schedule_admissions()
        self._schedule_inbound()
        for crash in s.crashes:
            self.at(crash.at, "crash", crash)
        if s.destinations:
            self.at(0.0, "sweep")
        if s.inbound is not None:
            self.at(0.0, "retry_sweep")
            self.at(0.0, "silence")
        self.at(0.0, "sample")

    def _schedule_admissions(self) -> None:
        for a in self.scenario.admissions:
            targets = a.destinations or self.scenario.names()
            step = a.over / a.orders
            for n in range(a.orders):
                order_id = f"{a.prefix}_{n + 1:05d}"
                first = a.start + n * step
                for i, event in enumerate(a.events):
                    at = round(first + i * a.gap, 6)
                    key = message_key("order", order_id, event, 1)
                    item = {
                        "key": key,
                        "event": event,
                        "order_id": order_id,
                        "ordering_key": f"order:{order_id}" if a.ordering else None,
                        "targets": targets,
                        "metadata": a.metadata,
                    }
                    self.at(at, "admit", item)
                    for r, repeat in enumerate(a.repeats):
                        if world.chance(self.seed, "repeat", r, key) < repeat.share:
                            self.at(round(at + repeat.after, 6), "admit", item | {"repeat": True})

    def _schedule_inbound(self) -> None:
        spec = self.scenario.inbound
        if spec is None:
            return
        step = spec.over / spec.events
        n = 0
        for i in range(spec.events):
            at = i * step
            if any(w.holds(at) for w in spec.silent):
                continue
            n += 1
            key = f"evt_{n:05d}"
            if world.chance(self.seed, "fail", key) < spec.fail_after_effect:
                world.current_receiver.fail_first.add(key)
            if world.chance(self.seed, "late", key) < spec.late:
                at += spec.late_by * world.chance(self.seed, "late-by", key)
            self.at(round(at, 6), "inbound", {"key": key, "first": True})
            if world.chance(self.seed, "dup", key) < spec.duplicates:
                self.at(round(at + spec.duplicates_after, 6), "inbound", {"key": key})

    def _loop(self) -> None:
        counting = connection.execute_wrapper(self._count_statement)
        with counting:
            while self._queue and self._queue[0][0] <= self.scenario.duration:
                offset, _, kind, payload = heapq.heappop(self._queue)
                self._traveller.move_to(self._start + timedelta(seconds=offset))
                self._phase = kind
                self._do(kind, payload)
                self._phase = "other"
            self._traveller.move_to(self._start + timedelta(seconds=self.scenario.duration))

    def _count_statement(self, execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        # the transaction's bounds (PostgreSQL's set_config) are not work of their own
        if not sql.lstrip().upper().startswith("SELECT SET_CONFIG"):
            self.obs.statements[self._phase] += 1
        return execute(sql, *args)

    def _do(self, kind: str, payload: Any) -> None:
        beat = self.scenario.beat
        if kind == "admit":
            self._admit(payload)
        elif kind == "relay":
            self._relays_queued.discard((payload, round(self.now(), 6)))
            relay_run(payload)
        elif kind == "sweep":
            trigger.relay_sweep()
            self.at(self.now() + beat.relay_sweep, "sweep")
        elif kind == "retry_sweep":
            failed_events_retry_due()
            self.at(self.now() + beat.retry_sweep, "retry_sweep")
        elif kind == "silence":
            silence_check()
            self.at(self.now() + beat.silence_check, "silence")
        elif kind == "inbound":
            self._post(payload)
        elif kind == "crash":
            self._crash(payload)
        elif kind == "sample":
            self._sample()
            self.at(self.now() + max(1.0, self.scenario.duration / SAMPLES), "sample")

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
        round_ = relay_claim_module.relay_claim(destination=dest)
        if crash.after == "send":
            relay_send(dest, round_.claimed)
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
        for name, dest in self._destinations.items():
            open_ = OutboxMessage.objects.filter(
                destination=dest, status__in=["pending", "sending"]
            )
            # eligible: due, or leased by a worker whose lease ran out
            due = open_.filter(
                Q(status="pending", next_attempt_at__lte=moment)
                | Q(status="sending", lease_until__lte=moment)
            ).order_by("id")
            oldest = due.values_list("created_at", flat=True).first()
            age = (moment - oldest).total_seconds() if oldest else 0.0
            self.obs.samples[name].append((now, open_.count(), age))

    # --- what the run left ---

    def _collect(self) -> None:
        self._phase = "collect"
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
