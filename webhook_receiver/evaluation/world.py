"""What the simulation puts around the app's real code: the merchants behind the network
(``SimulatedTransport``, the relay's transport in simulated time), the sender in front
of the receiver, the effect the receiver's handler applies, and a cache every simulated
process shares.

A simulated merchant is a careful receiver: it verifies the Standard Webhooks signature
over the body, deduplicates on ``webhook-id`` (the first request with a key applies its
effect, a later one is answered 200 from memory), and keeps the effects it applied per
logical event (the ``id`` the payload names), which the invariants count. Its faults are
decided per key and attempt from the seed, never from the order in which the relay's
threads reach it, so a run is the same on every machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import connection

from ..exceptions import RejectedRequest, TransientError
from ..inbound.handlers import WebhookEvent
from ..outbound.relay.transport import Answer, NoAnswer
from ..schemes.standard import StandardWebhooks
from .inputs import Destination, Fault

MERCHANT_DOMAIN = "merchant.test"
EFFECT_TABLE = "webhook_eval_effect"


def chance(seed: int, *parts: object) -> float:
    """A number in [0, 1) decided by the seed and ``parts`` alone (a key, a purpose)."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Arrival:
    """One request as a merchant saw it."""

    at: float  # simulated seconds since the scenario's start
    seq: int  # its place among this merchant's arrivals
    destination: str
    event: str  # the logical event the payload names
    webhook_id: str
    idempotency_key: str
    seen: int  # the merchant's count of requests for this event, this one included
    outcome: str  # applied, duplicate, refused, answered, lost, timeout, down
    # when its answer reached the relay, or its deadline passed (the simulated time a
    # request takes: a merchant's delay, a timeout that lasts the destination's timeout)
    answered: float
    round: int  # the relay's round that sent it (requests sent together share one)
    status: int | None = None
    retry_after: float | None = None  # what it asked for, in seconds


class Merchant:
    def __init__(self, spec: Destination, *, secret: str, seed: int, clock: Callable[[], float]):
        self.spec = spec
        self.secret = secret
        self.seed = seed
        self.clock = clock
        self.arrivals: list[Arrival] = []
        self.effects: Counter[str] = Counter()
        self.applied_ids: set[str] = set()
        self.seen: Counter[str] = Counter()
        # per key, how long the last request's answer took (read once the round is sent)
        self.answer_seconds: dict[str, float] = {}
        # requests on their way: when each is answered, and the round that sent it
        self._open: list[tuple[float, int]] = []
        # rounds: requests started at one instant with no answer come between them
        self.answered = 0
        self._round_key: tuple[float, int] | None = None
        self._round = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def round_now(self) -> int:
        """The round a request starting now belongs to: the same as the one before it
        if it starts at the same instant and no answer has reached the relay since (the
        requests of one claim), else a new one."""
        key = (self.clock(), self.answered)
        if key != self._round_key:
            self._round_key, self._round = key, self._round + 1
        return self._round

    def handle(self, headers: dict[str, str], body: bytes, round_: int = 0) -> Answer:
        """One request: its answer, or NoAnswer (down, a timeout, a lost response)."""
        with self._lock:
            return self._answer(headers, body, round_)

    def _answer(self, headers: dict[str, str], body: bytes, round_: int) -> Answer:
        at = self.clock()
        try:
            payload = json.loads(body)
            event = str(payload["id"])
            event_type = str(payload.get("type", ""))
        except (ValueError, KeyError, TypeError):
            event, event_type = "", ""
        self.seen[event] += 1
        seen = self.seen[event]
        webhook_id = headers.get("webhook-id", "")
        fault = self._fault(event, event_type, seen, at)
        timeout = self.spec.timeout_seconds
        if fault is not None and fault.kind == "down":
            took = 0.0  # refused at once
        elif fault is not None and fault.kind == "timeout":
            took = timeout
        else:
            delay = fault.delay if fault is not None else None
            took = min(timeout, self.spec.delay_seconds if delay is None else delay)
        # what the relay waits for its answer: the simulation holds its lane that long
        self.answer_seconds[webhook_id] = took
        # in flight here: requests not yet answered, and those sent with this one
        self._open = [(end, r) for end, r in self._open if end > at or (end == at and r == round_)]
        self._open.append((round(at + took, 6), round_))
        self.max_in_flight = max(self.max_in_flight, len(self._open))
        base: dict[str, Any] = {
            "at": at,
            "seq": len(self.arrivals),
            "destination": self.spec.name,
            "event": event,
            "webhook_id": webhook_id,
            "idempotency_key": headers.get("idempotency-key", ""),
            "seen": seen,
            "answered": round(at + took, 6),
            "round": round_,
        }
        if fault is not None and fault.kind in ("down", "timeout"):
            self.arrivals.append(Arrival(**base, outcome=fault.kind))
            if fault.kind == "down":
                raise NoAnswer("ConnectError", "connection refused (the merchant is down)")
            raise NoAnswer("ReadTimeout", "the merchant did not answer in time")
        # an answer that would come at or after the deadline never reaches the relay
        late = took >= timeout
        try:
            StandardWebhooks().verify(secrets=(self.secret,), headers=headers, body=body)
        except RejectedRequest:
            return self._reply(base, late, "refused", 401, "bad signature")
        if fault is not None and fault.kind == "status":
            wait = _seconds(fault.retry_after)
            headers = {"retry-after": fault.retry_after} if fault.retry_after else {}
            status = fault.status or 500
            return self._reply(base, late, "answered", status, "try again", headers, wait)
        if webhook_id in self.applied_ids:
            return self._reply(base, late, "duplicate", 200, '{"duplicate":true}')
        self.applied_ids.add(webhook_id)
        self.effects[event] += 1
        if fault is not None and fault.kind == "lose_response":
            self.arrivals.append(Arrival(**base, outcome="lost"))
            raise NoAnswer(
                "RemoteProtocolError", "the connection dropped after the merchant committed"
            )
        return self._reply(base, late, "applied", 200, '{"applied":true}')

    def _reply(
        self,
        base: dict[str, Any],
        late: bool,
        outcome: str,
        status: int,
        text: str,
        headers: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> Answer:
        """The answer, or, when it comes too late, the relay's timeout (an effect applied
        on the way stays applied: the ambiguous case)."""
        if late:
            self.arrivals.append(Arrival(**base, outcome="lost" if status < 300 else "timeout"))
            raise NoAnswer("ReadTimeout", "the merchant answered after the deadline")
        self.arrivals.append(
            Arrival(**base, outcome=outcome, status=status, retry_after=retry_after)
        )
        retry = (headers or {}).get("retry-after")
        return Answer(status=status, retry_after=retry, body=text.encode())

    def _fault(self, event: str, event_type: str, seen: int, at: float) -> Fault | None:
        for fault in self.spec.faults:
            if not fault.applies_at(at):
                continue
            if fault.attempts and seen not in fault.attempts:
                continue
            if fault.events and event_type.rpartition(".")[2] not in fault.events:
                continue
            if fault.share < 1 and chance(self.seed, self.spec.name, fault.group, event) >= (
                fault.share
            ):
                continue
            return fault
        return None


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Network:
    """The merchants: a request to ``http://<destination>.merchant.test/…`` reaches that
    destination's merchant."""

    def __init__(self, merchants: dict[str, Merchant]):
        self.merchants = merchants

    @staticmethod
    def url(name: str) -> str:
        return f"http://{name}.{MERCHANT_DOMAIN}/webhooks"

    def merchant(self, url: str) -> Merchant | None:
        host = urlsplit(url).hostname or ""
        return self.merchants.get(host.removesuffix(f".{MERCHANT_DOMAIN}"))


class SimulatedTransport:
    """The relay's transport (``relay.transport.Transport``) in simulated time: each
    request reaches its merchant at once, and its answer comes when the merchant says (a
    delay; a timeout lasts the destination's timeout), the request's task asleep on the
    simulated clock meanwhile. Requests a relay started at one instant are one round
    (the merchants and the breaker's invariant count them so)."""

    def __init__(self, network: Network, clock: Callable[[], float]) -> None:
        self._network = network
        self._clock = clock

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, timeout: float
    ) -> Answer:
        merchant = self._network.merchant(url)
        if merchant is None:
            raise NoAnswer("ConnectError", f"no such host: {urlsplit(url).hostname}")
        failure: NoAnswer | None = None
        try:
            answer = merchant.handle(headers, body, merchant.round_now())
        except NoAnswer as exc:
            failure = exc
        took = merchant.answer_seconds.pop(headers.get("webhook-id", ""), 0.0)
        # an answer at once still comes after the other requests of its claim started
        await asyncio.sleep(took)
        merchant.answered += 1
        if failure is not None:
            raise failure
        return answer

    async def close(self) -> None:
        pass


# --- the receiver's side -------------------------------------------------------------------


class Receiver:
    """The effect this app's handler applies for the simulated sender's events: a row in
    a table of the evaluation's own database, in the claim's transaction. For a share of
    events the handler fails after writing it, on the first try only (a dependency that
    failed mid-way): the claim's rollback must take the effect back."""

    def __init__(self) -> None:
        self.fail_first: set[str] = set()
        self.tries: Counter[str] = Counter()

    def reset(self) -> None:
        """Back to a receiver that has seen nothing (between scenarios)."""
        self.fail_first.clear()
        self.tries.clear()

    @staticmethod
    def create_table() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {EFFECT_TABLE}")
            cursor.execute(
                f"CREATE TABLE {EFFECT_TABLE} (event_key varchar(255) NOT NULL, "
                "applied_at varchar(40) NOT NULL)"
            )

    @staticmethod
    def effects() -> Counter[str]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT event_key FROM {EFFECT_TABLE}")
            return Counter(row[0] for row in cursor.fetchall())

    def apply(self, event: WebhookEvent) -> None:
        self.tries[event.event_key] += 1
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {EFFECT_TABLE} (event_key, applied_at) VALUES (%s, %s)",
                [event.event_key, str(event.payload.get("created", ""))],
            )
        if event.event_key in self.fail_first and self.tries[event.event_key] == 1:
            raise TransientError("the stock service timed out after the effect was written")


# the receiver of the run in progress (the handler setting names a dotted path)
current_receiver = Receiver()


def apply_effect(event: WebhookEvent) -> None:
    """The handler the evaluation registers for its sender's event types."""
    current_receiver.apply(event)


class SharedMemoryCache(BaseCache):
    """Local memory that the app takes for a cache every process shares (as Redis is in
    production): the simulation is one process playing all of them, so the relay's
    "a run is already queued" marks behave as they do on a deployment."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)
        self._local = LocMemCache(f"webhook-eval-{location}", params)

    def add(
        self,
        key: Any,
        value: Any,
        timeout: float | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return self._local.add(key, value, timeout, version)

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._local.get(key, default, version)

    def set(
        self,
        key: Any,
        value: Any,
        timeout: float | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        self._local.set(key, value, timeout, version)

    def touch(
        self, key: Any, timeout: float | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return self._local.touch(key, timeout, version)

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._local.delete(key, version)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._local.has_key(key, version)

    def clear(self) -> None:
        self._local.clear()
