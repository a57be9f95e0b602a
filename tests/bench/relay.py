"""Benchmark of the outbox relay: throughput, the limiter's accuracy, the latency from
commit to arrival, and the relay process at scale (make bench-relay; a command, not a
timed test).

    python -m tests.bench.relay [--messages N] [--rounds N] [--rate R] [--samples N] [--herd]
        [--scale 10,100,300,1000 | --skip-scale] [--scale-rounds R] [--black-holes B]
        [--scale-only]
        [--profile [--py-spy PATH]]

It recreates a ``webhook_receiver_bench_relay`` database on the local PostgreSQL
(BENCH_RELAY_DATABASE_URL to change it), migrates it, and starts the receiver: a minimal
HTTP/1.1 server in a process of its own (asyncio, keep-alive), which answers 200 at once
and records each arrival's CLOCK_MONOTONIC time and ``webhook-id``. Then:

1. Throughput, in this process: N messages admitted with ``enqueue_webhook`` (500 a
   transaction), then ``relay_destination`` called until the backlog is empty, for a
   destination whose limits do not bind (10 in flight). The floor, in the same rounds
   (which goes first alternates): the same signed requests (the relay's own
   ``signed_request``: same bodies, same headers) posted by a plain aiohttp loop (the
   relay's client), one session, the same 10 requests in flight (ten tasks, each taking
   the next request as soon as its answer is read). Every statement the relay runs is
   counted (``connection.execute_wrapper``), and its transactions (each a BEGIN and a
   COMMIT).
2. The limiter, on a relay process (``manage.py webhook_relay``, default settings):
   20·R messages for a destination limited to R a second with a burst of R, admitted
   while it runs (their commits' notifications wake it). Its figures: the rate of
   arrivals at the receiver once the burst is spent, and the bucket's promise (at most
   R·T + burst starts in any T seconds) on the recorded starts.
3. Latency, on the same relay process: one message at a time, admitted and committed;
   from the commit to the arrival at the receiver.
4. With ``--herd`` (no target): the limiter's backlog again, one message a transaction
   (each its own notification), while another destination's messages are timed from
   commit to arrival.
5. The scale (relay_scale.py; ``--skip-scale`` to leave it out): for each N of
   ``--scale``, N merchants with the model's default limits and 20 messages each,
   delivered by one relay process and by a plain asyncio floor process in the same
   run, ``--scale-rounds`` times (3; medians); then ``--black-holes`` black holes beside
   300 healthy merchants (0: none), and with ``--profile`` one more relay run at N = 300
   under py-spy or cProfile.

Targets: relay ≥ 0.5 × floor; ≤ 3 statements a delivery; a steady rate within
0.95 R … R (1% allowed for the arrivals' jitter); starts within R·T + burst (+1);
p95 latency under 200 ms; at N ≥ 300 the relay's deliveries/s ≥ 0.5 × the floor's and
its CPU a delivery ≤ 2 × the floor's; at most 2 + 1 database connections; threads
that do not grow with N; the healthy merchants' p99 beside black holes ≤ 2 × without.
Exits 1 when one is missed or a message went missing or arrived twice.
Results: bench-results/relay.json (with every arrival and start of the limiter's runs),
the relay processes' logs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import multiprocessing as mp
import os
import signal
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from tests.support.limits import bucket_excess, worst_window
from tests.support.wire import read_webhook

from .cli import bench_main
from .common import SHOP_SECRET
from .relay_scale import (
    EVENT_TYPE,
    Context,
    RelayProcess,
    analyze,
    find_py_spy,
    order_payload,
    scale,
    scale_checks,
    scale_problems,
    scale_render,
)
from .server import RESULTS_DIR, database_recreate, git_commit

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_relay"
HOST = "127.0.0.1"
DEFAULT_SCALE = (10, 100, 300, 1000)
DEFAULT_SCALE_ROUNDS = 3
DEFAULT_BLACK_HOLES = 30
ADMIT_BATCH = 500  # messages admitted per transaction
IN_FLIGHT = 10  # the throughput destination's max_in_flight, and the floor's concurrency
WARMUP_MESSAGES = 200
COMMIT_SAMPLES = 1000  # one-row transactions timed for the single merchant's ceiling
LATENCY_WARMUP = 5
LATENCY_SPACING_SECONDS = 0.05
WAIT_SECONDS = 10.0  # the longest the receiver is asked to wait for one arrival

# targets
THROUGHPUT_RATIO = 0.5
STATEMENTS_PER_DELIVERY = 3.0
RATE_LOW = 0.95
# arrival times carry the loopback's jitter: 1% over R is measurement, not the limiter
RATE_HIGH = 1.01
LATENCY_P95_MS = 200.0
# a start is timestamped a moment after the claim that spent its token
BUCKET_SLACK = 1.0


# --- the receiver: its own process, so it never competes with the relay for the GIL ----

OK_RESPONSE = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
)


class _Arrivals:
    def __init__(self) -> None:
        self.pending: list[tuple[float, str]] = []  # since the last GET /arrivals
        self.count = 0
        self.at: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Future[float]] = {}

    def arrive(self, key: str) -> None:
        now = time.monotonic()
        self.pending.append((now, key))
        self.count += 1
        self.at[key] = now
        waiter = self.waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)

    async def control(self, target: str) -> tuple[int, Any]:
        url = urlsplit(target)
        if url.path == "/arrivals":  # what arrived since the last call, and the CPU spent
            taken, self.pending = self.pending, []
            return 200, {"arrivals": taken, "cpu_s": time.process_time(), "count": self.count}
        if url.path == "/wait":  # a long poll: when the message with this key arrived
            key = parse_qs(url.query)["key"][0]
            if key not in self.at:
                waiter = self.waiters.setdefault(key, asyncio.get_running_loop().create_future())
                try:
                    await asyncio.wait_for(asyncio.shield(waiter), timeout=WAIT_SECONDS)
                except TimeoutError:
                    return 504, {"error": "not arrived"}
            return 200, {"at": self.at[key]}
        return 404, {"error": "no such control"}


async def _connection(state: _Arrivals, reader: asyncio.StreamReader, writer) -> None:
    try:
        while True:
            method, target, key = await read_webhook(reader)
            if method == b"POST":
                state.arrive(key)
                writer.write(OK_RESPONSE)
                continue
            status, document = await state.control(target.decode())
            body = json.dumps(document).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _receiver_main(sock: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner stops it, with SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    state = _Arrivals()

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda r, w: _connection(state, r, w), sock=sock, backlog=128
        )
        await server.serve_forever()

    asyncio.run(serve())


class Receiver:
    """The receiver process, and a control connection to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}/hooks"
        self.process = mp.get_context("fork").Process(
            target=_receiver_main, args=(self.sock,), daemon=True
        )
        self._conn: HTTPConnection | None = None

    def start(self) -> None:
        self.sock.listen(128)
        self.process.start()
        self.sock.close()  # the child holds it now

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)

    def _get(self, target: str) -> dict[str, Any]:
        if self._conn is None:
            self._conn = HTTPConnection(HOST, self.port, timeout=30)
        self._conn.request("GET", target)
        response = self._conn.getresponse()
        document = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"receiver {target}: {response.status} {document}")
        return document

    def drain(self) -> tuple[list[tuple[float, str]], float]:
        """The arrivals since the last drain, and the receiver's CPU seconds so far."""
        document = self._get("/arrivals")
        return [tuple(a) for a in document["arrivals"]], document["cpu_s"]

    def arrived_at(self, key: str) -> float | None:
        """When the message with this key arrived; None if not within WAIT_SECONDS."""
        if self._conn is None:
            self._conn = HTTPConnection(HOST, self.port, timeout=30)
        self._conn.request("GET", f"/wait?key={quote(key)}")
        response = self._conn.getresponse()
        document = json.loads(response.read())
        return document["at"] if response.status == 200 else None


# --- the runs ----------------------------------------------------------------------


def admit(dest, count: int, tag: str, batch: int = ADMIT_BATCH) -> list[str]:
    """``count`` messages with distinct ordering keys (one order each), as the shop admits
    them, ``batch`` per transaction; each commit notifies the relays."""
    from django.db import transaction

    from webhook_receiver.outbound import enqueue_webhook, message_key

    keys = []
    for first in range(0, count, batch):
        with transaction.atomic():
            for i in range(first, min(first + batch, count)):
                key = message_key("order", f"ord-{tag}-{i}", "paid", 1)
                enqueue_webhook(
                    dest,
                    EVENT_TYPE,
                    key,
                    order_payload(tag, i),
                    ordering_key=f"order:ord-{tag}-{i}",
                )
                keys.append(key)
    return keys


def destination(name: str, url: str, **limits: Any):
    from webhook_receiver.models import WebhookDestination

    return WebhookDestination.objects.create(
        name=name, url=url, secrets=[SHOP_SECRET], event_types=[EVENT_TYPE], **limits
    )


@dataclass
class Counted:
    statements: int = 0
    transactions: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


def relay_until_empty(destination_id: int, counted: Counted) -> int:
    """``relay_destination`` again and again until it sends nothing, counting every
    statement and every transaction it runs."""
    from django.db import connection, connections

    from webhook_receiver.outbound.relay.process import relay_destination

    def count(execute, sql, params, many, context):
        # executemany runs its statement once per parameter set
        n = len(params) if many else 1
        counted.statements += n
        kind = _statement_kind(sql)
        counted.kinds[kind] = counted.kinds.get(kind, 0) + n
        return execute(sql, params, many, context)

    # each COMMIT closes a transaction; its BEGIN is implicit (psycopg sends it)
    db = connections["default"]
    commit = db.commit

    def counting_commit() -> None:
        counted.transactions += 1
        commit()

    db.commit = counting_commit
    sent = 0
    try:
        with connection.execute_wrapper(count):
            while True:
                round_sent, _ = relay_destination(destination_id=destination_id)
                if not round_sent:
                    return sent
                sent += round_sent
    finally:
        del db.commit


@functools.lru_cache(maxsize=256)
def _statement_kind(sql: str) -> str:
    """A statement, short: its verb and table (``SELECT webhookdestination for update``),
    the table read at the statement's own level, not a subquery's. Cached: the count
    runs inside the relay's timed rounds, and a statement's text is the same each time."""
    words = sql.replace('"', "").replace("(", " ( ").replace(")", " ) ").split()
    upper = [w.upper() for w in words]
    verb, table, depth = "", "", 0
    for i, word in enumerate(upper[:-1]):
        depth += (word == "(") - (word == ")")
        if depth == 0 and not verb and word in ("SELECT", "UPDATE", "INSERT", "DELETE"):
            verb = word
        if depth == 0 and not table and word in ("FROM", "UPDATE", "INTO"):
            table = words[i + 1]
    kind = f"{verb} {table.removeprefix('webhook_receiver_')}"
    return kind + (" for update" if "FOR UPDATE" in " ".join(upper) else "")


def floor_requests(dest, keys: Sequence[str]) -> list[tuple[bytes, dict[str, str]]]:
    """The requests the relay sends for these messages, signed by the relay's own code."""
    from webhook_receiver.models import OutboxMessage
    from webhook_receiver.outbound.relay.messages import Claimed
    from webhook_receiver.outbound.relay.transport import signed_request

    rows = OutboxMessage.objects.filter(destination=dest, key__in=keys).order_by("id")
    now = int(time.time())
    return [
        signed_request(
            dest,
            Claimed(
                id=m.id,
                key=m.key,
                event_type=m.event_type,
                payload=m.payload,
                attempt=1,
                failures=0,
                created_at=m.created_at,
            ),
            now,
        )
        for m in rows.only("id", "key", "event_type", "payload", "created_at")
    ]


def floor_run(url: str, requests: Sequence[tuple[bytes, dict[str, str]]], timeout: float) -> int:
    """Post every request once, IN_FLIGHT at a time, with aiohttp as the relay does (one
    session, keep-alive, each request bounded by the destination's timeout): a closed
    loop, each of IN_FLIGHT tasks taking the next request as soon as its answer is read.
    Returns the number of errors."""
    import aiohttp

    async def post_all() -> int:
        items = iter(requests)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session:

            async def loop() -> int:
                errors = 0
                for body, headers in items:
                    async with asyncio.timeout(timeout):
                        async with session.post(
                            url, data=body, headers=headers, allow_redirects=False
                        ) as response:
                            await response.read()  # as the relay reads it
                    errors += response.status != 200
                return errors

            return sum(await asyncio.gather(*(loop() for _ in range(IN_FLIGHT))))

    return asyncio.run(post_all())


@dataclass
class Round:
    relay_per_s: float
    floor_per_s: float
    relay_cpu_ms: float  # this process's CPU per delivery (every thread)
    floor_cpu_ms: float
    receiver_cpu_ms: float  # the receiver's CPU per request, both runs

    @property
    def ratio(self) -> float:
        return self.relay_per_s / self.floor_per_s


def throughput(args: argparse.Namespace, receiver: Receiver) -> dict[str, Any]:
    from webhook_receiver.models import OutboxMessage

    dest = destination(
        "throughput",
        receiver.url,
        rate_count=1_000_000,
        burst=1_000_000,
        max_in_flight=IN_FLIGHT,
    )
    counted = Counted()
    rounds: list[Round] = []
    problems: list[str] = []
    # the warm-up round (figures discarded): connections, imports, prepared statements
    plan = [("warmup", WARMUP_MESSAGES)] + [(f"r{n}", args.messages) for n in range(args.rounds)]
    delivered = 0
    for number, (tag, count) in enumerate(plan):
        keys = admit(dest, count, tag)
        analyze()
        requests = floor_requests(dest, keys)
        receiver.drain()
        figures: dict[str, tuple[float, float, float]] = {}
        # alternate which goes first: neither always gets the machine's quieter seconds
        for which in ("floor", "relay") if number % 2 else ("relay", "floor"):
            _, receiver_cpu = receiver.drain()
            cpu, started = time.process_time(), time.perf_counter()
            if which == "floor":
                errors = floor_run(receiver.url, requests, dest.timeout_seconds)
                if errors:
                    problems.append(f"{tag} floor: {errors} answers were not 200")
            else:
                target = counted if tag != "warmup" else Counted()
                sent = relay_until_empty(dest.pk, target)
                if sent != count:
                    problems.append(f"{tag} relay: sent {sent} of {count}")
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu
            arrivals, receiver_cpu_after = receiver.drain()
            if len(arrivals) != count:
                problems.append(f"{tag} {which}: {len(arrivals)} arrivals, {count} expected")
            figures[which] = (count / seconds, cpu, receiver_cpu_after - receiver_cpu)
        delivered += count
        stored = OutboxMessage.objects.filter(destination=dest, status="delivered").count()
        if stored != delivered:
            problems.append(f"{tag}: {stored} messages delivered in the table, {delivered} sent")
        if tag == "warmup":
            continue
        round_ = Round(
            relay_per_s=figures["relay"][0],
            floor_per_s=figures["floor"][0],
            relay_cpu_ms=figures["relay"][1] * 1000 / count,
            floor_cpu_ms=figures["floor"][1] * 1000 / count,
            receiver_cpu_ms=(figures["relay"][2] + figures["floor"][2]) * 1000 / (2 * count),
        )
        rounds.append(round_)
        print(
            f"  round {len(rounds)}/{args.rounds}  relay {round_.relay_per_s:7.1f}/s  "
            f"floor {round_.floor_per_s:7.1f}/s  ratio {round_.ratio:.2f}",
            flush=True,
        )
    deliveries = args.messages * args.rounds
    floor_per_s = statistics.median(r.floor_per_s for r in rounds)
    commit_ms = one_row_commit_ms()
    return {
        "ceiling": relay_ceiling(floor_per_s, commit_ms),
        "commit_ms": commit_ms,
        "rounds": [asdict(r) | {"ratio": r.ratio} for r in rounds],
        "relay_per_s": statistics.median(r.relay_per_s for r in rounds),
        "floor_per_s": floor_per_s,
        "ratio": statistics.median(r.ratio for r in rounds),
        "relay_cpu_ms": statistics.median(r.relay_cpu_ms for r in rounds),
        "floor_cpu_ms": statistics.median(r.floor_cpu_ms for r in rounds),
        "receiver_cpu_ms": statistics.median(r.receiver_cpu_ms for r in rounds),
        "statements": counted.statements,
        "transactions": counted.transactions,
        "statements_per_delivery": counted.statements / deliveries,
        "transactions_per_delivery": counted.transactions / deliveries,
        "statement_kinds": counted.kinds,
        "problems": problems,
    }


def one_row_commit_ms() -> float:
    """The median of COMMIT_SAMPLES transactions of one row's update on this database:
    the least a relay's record of an answer costs (a table of its own, logged as the
    outbox is, dropped after)."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_commit (id int PRIMARY KEY, n int NOT NULL)")
        cursor.execute("INSERT INTO bench_commit VALUES (1, 0)")
    samples = []
    try:
        for _ in range(COMMIT_SAMPLES):
            started = time.perf_counter()
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE bench_commit SET n = n + 1 WHERE id = 1")
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bench_commit")
    return statistics.median(samples)


def relay_ceiling(floor_per_s: float, commit_ms: float) -> float:
    """The single merchant's ceiling, as a ratio to the floor, of any relay that records
    an answer in the database before its slot's next request (the in-flight limit is the
    database's, shared by every process) and does nothing else: each of the IN_FLIGHT
    slots takes the floor's time for a request, then one commit."""
    request_ms = IN_FLIGHT * 1000 / floor_per_s
    return request_ms / (request_ms + commit_ms)


# --- on a relay process ------------------------------------------------------------------


def limiter(args: argparse.Namespace, receiver: Receiver, dest) -> dict[str, Any]:
    """The deep backlog admitted while the relay runs (each commit wakes it); read the
    arrivals' rate at the receiver."""
    count = 20 * args.rate
    receiver.drain()
    admit(dest, count, "limited")
    arrivals: list[tuple[float, str]] = []
    deadline = time.monotonic() + count / args.rate + 60
    while len(arrivals) < count and time.monotonic() < deadline:
        time.sleep(0.5)
        arrivals += receiver.drain()[0]
    time.sleep(1.0)  # nothing more may come
    arrivals += receiver.drain()[0]
    return limited_figures(dest, arrivals, rate=args.rate, burst=args.rate, count=count)


def herd(args: argparse.Namespace, receiver: Receiver) -> dict[str, Any]:
    """The same backlog admitted one message a transaction (each commit its own
    notification, as when each inbound event admits one), while another destination's
    messages are timed from commit to arrival, one every half second."""
    rate, count = args.rate, 20 * args.rate
    dest = destination("herd", receiver.url, rate_count=rate, burst=rate, max_in_flight=IN_FLIGHT)
    bystander = destination("bystander", receiver.url, rate_count=1000, burst=1000)
    receiver.drain()
    started = time.monotonic()
    admit(dest, count, "herd", batch=1)
    admitted_s = time.monotonic() - started
    arrivals: list[tuple[float, str]] = []
    samples: list[float] = []
    deadline = time.monotonic() + count / rate + 90
    while len(arrivals) < count and time.monotonic() < deadline:
        samples.append(commit_to_arrival(receiver, bystander, "bystander", len(samples)))
        arrivals += [a for a in receiver.drain()[0] if a[1].startswith("order:ord-herd-")]
        time.sleep(0.5)
    delivered_s = time.monotonic() - started
    figures = limited_figures(dest, arrivals, rate=rate, burst=rate, count=count)
    return figures | {
        "admitted_after_s": admitted_s,
        "delivered_after_s": delivered_s,
        "bystander": _latencies(samples),
    }


def limited_figures(
    dest, arrivals: list[tuple[float, str]], *, rate: int, burst: int, count: int
) -> dict[str, Any]:
    """The limited destination's rate at the receiver, and the token bucket's promise
    checked both at the receiver and at the relay's recorded starts."""
    from webhook_receiver.models import DeliveryAttempt

    times = sorted(at for at, _ in arrivals)
    problems = []
    if len(times) != count:
        problems.append(f"{dest.name}: {len(times)} arrivals, {count} expected")
    if len({key for _, key in arrivals}) != len(arrivals):
        problems.append(f"{dest.name}: a message arrived twice")
    # the steady part: from the arrival after twice the burst (the burst is spent by then)
    steady = times[2 * burst :]
    steady_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    # the bucket's promise: in any T seconds, at most rate * T + burst starts. It holds
    # where the relay keeps it, at each attempt's start; arrivals add the requests' own
    # spread (the first ones open the connections).
    starts = sorted(
        at.timestamp()
        for at in DeliveryAttempt.objects.filter(message__destination=dest).values_list(
            "started_at", flat=True
        )
    )
    first_second = sum(1 for t in times if t - times[0] < 1.0) if times else 0
    return {
        "rate": rate,
        "burst": burst,
        "messages": count,
        "arrivals": len(times),
        "duration_s": times[-1] - times[0] if times else 0.0,
        "steady_rate": steady_rate,
        "steady_ratio": steady_rate / rate,
        "first_second": first_second,
        "worst_1s_window": worst_window(times, 1.0),
        "worst_1s_window_after_burst": worst_window(steady, 1.0),
        "bucket_excess": bucket_excess(times, rate, burst),
        "starts_bucket_excess": bucket_excess(starts, rate, burst),
        "starts_worst_1s_window": worst_window(starts, 1.0),
        "arrivals_s": [round(t - times[0], 4) for t in times],
        "starts_s": [round(t - starts[0], 4) for t in starts],
        "problems": problems,
    }


def latency(args: argparse.Namespace, receiver: Receiver, dest) -> dict[str, Any]:
    """One message at a time: commit, then wait for its arrival; LATENCY_SPACING_SECONDS
    between samples, so the queue is idle when each is admitted."""
    samples: list[float] = []
    for n in range(LATENCY_WARMUP + args.samples):
        sample = commit_to_arrival(receiver, dest, "latency", n)
        if n >= LATENCY_WARMUP:
            samples.append(sample)
        time.sleep(LATENCY_SPACING_SECONDS)
    return _latencies(samples)


def commit_to_arrival(receiver: Receiver, dest, tag: str, n: int) -> float:
    """Admit one message and commit; milliseconds until it arrives (inf: not within
    WAIT_SECONDS)."""
    from django.db import transaction

    from webhook_receiver.outbound import enqueue_webhook, message_key

    key = message_key("order", f"ord-{tag}-{n}", "paid", 1)
    committed: list[float] = []
    with transaction.atomic():
        # registered first, so it runs first after the commit (whose notification has
        # gone by then: the time is taken a little late, never early)
        transaction.on_commit(lambda: committed.append(time.monotonic()))
        enqueue_webhook(dest, EVENT_TYPE, key, order_payload(tag, n), ordering_key=f"order:{key}")
    arrived = receiver.arrived_at(key)
    return math.inf if arrived is None else (arrived - committed[0]) * 1000


def _latencies(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "samples": len(samples),
        "p50_ms": _percentile(ordered, 0.50),
        "p95_ms": _percentile(ordered, 0.95),
        "max_ms": ordered[-1],
        "all_ms": samples,
    }


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest rank: a latency some message really had."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# --- the run ------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    sizes = [int(n) for n in text.split(",") if n.strip()]
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError("each N must be at least 1")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=2000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (median)")
    parser.add_argument("--rate", type=int, default=50, help="the limited destination's R/s")
    parser.add_argument("--samples", type=int, default=100, help="latency samples")
    parser.add_argument(
        "--herd",
        action="store_true",
        help="also: a throttled backlog admitted one message a transaction (no target; ~1 min)",
    )
    parser.add_argument(
        "--scale",
        type=_sizes,
        default=list(DEFAULT_SCALE),
        metavar="N,N,…",
        help="the scale's numbers of merchants (default 10,100,300,1000)",
    )
    parser.add_argument(
        "--scale-rounds",
        type=int,
        default=DEFAULT_SCALE_ROUNDS,
        metavar="R",
        help="times each N is run, relay and floor in turn (medians; default 3)",
    )
    parser.add_argument("--skip-scale", action="store_true", help="leave the scale out")
    parser.add_argument(
        "--scale-only", action="store_true", help="the scale alone (no phases 1 to 4)"
    )
    parser.add_argument(
        "--black-holes",
        type=int,
        default=DEFAULT_BLACK_HOLES,
        metavar="B",
        help="black holes beside 300 healthy merchants, a relay run of its own (0: none)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also: a relay run at N = 300 profiled (py-spy if found, else cProfile)",
    )
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy's executable (default: PATH's)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "relay.json")


def run(args: argparse.Namespace) -> int:
    if args.scale_only and args.skip_scale:
        raise SystemExit("--scale-only and --skip-scale: nothing to run")
    url = os.environ.get("BENCH_RELAY_DATABASE_URL", DEFAULT_URL)
    return with_receiver(url, lambda env, receiver: _run(args, env, url, receiver))


def with_receiver(url: str, body: Callable[[dict[str, str], Receiver], int]) -> int:
    """The bench database at ``url`` made afresh, this process's environment set for it
    (the bench's settings, its counters in-process), and the receiver forked before
    Django opens any connection: ``body(env, receiver)``'s exit status, the receiver
    stopped after it."""
    print("preparing the bench database ...", flush=True)
    database_recreate(url)
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE="tests.bench.settings", BENCH_DATABASE_URL=url)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    os.environ.update(env)
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    receiver = Receiver()
    receiver.start()
    try:
        return body(env, receiver)
    finally:
        receiver.stop()


def _run(args: argparse.Namespace, env: dict[str, str], url: str, receiver: Receiver) -> int:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    if not args.scale_only:
        _single(args, env, url, receiver, result)
    if not args.skip_scale:
        py_spy = find_py_spy(args.py_spy) if args.profile else None
        if args.profile and not py_spy:
            print("py-spy not found (--py-spy PATH): the profile is cProfile's, the loop's thread")
        print(
            f"\n5. scale: N = {', '.join(map(str, args.scale))} merchants, 20 messages each, "
            "relay process and floor process in turn",
            flush=True,
        )
        context = Context(env=env, url=url, results=RESULTS_DIR, py_spy=py_spy)
        result["scale"] = scale(
            context, args.scale, args.scale_rounds, args.black_holes, args.profile
        )

    config = {
        "commit": git_commit(),
        "messages": args.messages,
        "rounds": args.rounds,
        "rate": args.rate,
        "samples": args.samples,
        "in_flight": IN_FLIGHT,
        "cpu_count": os.cpu_count(),
        "herd": args.herd,
        "scale": None if args.skip_scale else args.scale,
        "scale_rounds": args.scale_rounds,
        "black_holes": args.black_holes,
        "load_average": os.getloadavg(),
    }
    checks = _checks(result) if "throughput" in result else []
    problems: list[str] = []
    print()
    if "throughput" in result:
        print(_render(result, checks))
        problems += result["throughput"]["problems"] + result["limiter"]["problems"]
        problems += result.get("herd", {}).get("problems", [])
    if "scale" in result:
        scale_checked = scale_checks(result["scale"])
        print()
        print(_checks_table(scale_checked))
        print()
        print(scale_render(result["scale"]))
        checks += scale_checked
        problems += scale_problems(result["scale"])
    for problem in problems:
        print(f"!!! {problem}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    document = {"config": config, "result": result, "checks": checks, "problems": problems}
    args.output.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nwrote {args.output}")
    return 0 if all(c["pass"] for c in checks) and not problems else 1


def _single(
    args: argparse.Namespace,
    env: dict[str, str],
    url: str,
    receiver: Receiver,
    result: dict[str, Any],
) -> None:
    """Phases 1 to 4: one merchant (the receiver)."""
    print(f"receiver on {receiver.url}: asyncio, HTTP/1.1 keep-alive, its own process")
    print(
        f"\n1. throughput: {args.rounds} rounds of {args.messages} messages "
        f"(and a warm-up of {WARMUP_MESSAGES}), {IN_FLIGHT} in flight",
        flush=True,
    )
    result["throughput"] = throughput(args, receiver)

    limited = destination(
        "limited", receiver.url, rate_count=args.rate, burst=args.rate, max_in_flight=IN_FLIGHT
    )
    # not the limiter but the wake-up is measured: limits that do not bind
    quick = destination("latency", receiver.url, rate_count=1000, burst=1000, max_in_flight=4)
    analyze()

    log = RESULTS_DIR / "relay-process.log"
    print(f"\nstarting a relay process (manage.py webhook_relay; log {log}) ...", flush=True)
    with RelayProcess(env, log, url) as relay:
        print(
            f"2. limiter: {20 * args.rate} messages at {args.rate}/s, burst {args.rate} ...",
            flush=True,
        )
        result["limiter"] = limiter(args, receiver, limited)
        print(f"3. latency: {args.samples} messages, one at a time ...", flush=True)
        result["latency"] = latency(args, receiver, quick)
        if args.herd:
            print(f"4. herd: {20 * args.rate} messages, one a transaction ...", flush=True)
            result["herd"] = herd(args, receiver)
    result["relay_log_problems"] = relay.problems()
    result["limiter"]["problems"] += [f"relay's log: {line}" for line in relay.problems()[:5]]


def _checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    t, lim, lat = result["throughput"], result["limiter"], result["latency"]
    rate = lim["rate"]
    return [
        {
            "figure": "deliveries/s",
            "value": t["relay_per_s"],
            "floor": t["floor_per_s"],
            "ratio": t["ratio"],
            "target": f">= {THROUGHPUT_RATIO} x floor",
            "pass": t["ratio"] >= THROUGHPUT_RATIO,
        },
        {
            "figure": "statements/delivery",
            "value": t["statements_per_delivery"],
            "floor": None,
            "ratio": None,
            "target": f"<= {STATEMENTS_PER_DELIVERY:g}",
            "pass": t["statements_per_delivery"] <= STATEMENTS_PER_DELIVERY,
        },
        {
            "figure": "limited rate/s",
            "value": lim["steady_rate"],
            "floor": rate,
            "ratio": lim["steady_ratio"],
            "target": f"{RATE_LOW} R .. R",
            "pass": RATE_LOW <= lim["steady_ratio"] <= RATE_HIGH,
        },
        {
            # at the receiver: no second holds more arrivals than the bucket allows
            "figure": "busiest second",
            "value": lim["worst_1s_window"],
            "floor": None,
            "ratio": None,
            "target": f"<= R + burst = {rate + lim['burst']}",
            "pass": lim["worst_1s_window"] <= rate + lim["burst"],
        },
        {
            # at the relay's recorded starts: the bucket's promise, R*T + burst in any T s
            "figure": "starts over bucket",
            "value": lim["starts_bucket_excess"],
            "floor": None,
            "ratio": None,
            "target": f"<= {BUCKET_SLACK:g}",
            "pass": lim["starts_bucket_excess"] <= BUCKET_SLACK,
        },
        {
            "figure": "latency p95 ms",
            "value": lat["p95_ms"],
            "floor": None,
            "ratio": None,
            "target": f"< {LATENCY_P95_MS:g}",
            "pass": lat["p95_ms"] < LATENCY_P95_MS,
        },
    ]


def _checks_table(checks: list[dict[str, Any]]) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    lines = [
        f"{'figure':<28}{'value':>10}{'floor':>10}{'ratio':>8}  {'target':<22}result",
        "-" * 86,
    ]
    for c in checks:
        lines.append(
            f"{c['figure']:<28}{cell(c['value'], 2):>10}{cell(c['floor'], 2):>10}"
            f"{cell(c['ratio'], 2):>8}  {c['target']:<22}{'pass' if c['pass'] else 'FAIL'}"
        )
    return "\n".join(lines)


def _render(result: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    t, lim, lat = result["throughput"], result["limiter"], result["latency"]
    lines = [
        _checks_table(checks),
        "",
        f"throughput: median of {len(t['rounds'])} rounds; per-round ratios "
        + ", ".join(f"{r['ratio']:.2f}" for r in t["rounds"]),
        f"  ceiling of any relay that commits an answer before its slot's next request: "
        f"{t['ceiling']:.2f} of the floor (a slot's request at the floor's pace "
        f"{IN_FLIGHT * 1000 / t['floor_per_s']:.3f} ms, a one-row transaction "
        f"{t['commit_ms']:.3f} ms); the relay is at {t['ratio'] / t['ceiling']:.2f} of it",
        f"  CPU per delivery in this process: relay {t['relay_cpu_ms']:.3f} ms, "
        f"floor {t['floor_cpu_ms']:.3f} ms; receiver {t['receiver_cpu_ms']:.3f} ms a request",
        f"  statements: {t['statements']}, {t['statements_per_delivery']:.2f} a delivery; "
        f"transactions: {t['transactions']}, "
        f"{t['transactions_per_delivery']:.2f} a delivery (each a BEGIN and a COMMIT more)",
        "  statements by kind: "
        + ", ".join(
            f"{k} {v}" for k, v in sorted(t["statement_kinds"].items(), key=lambda x: -x[1])
        ),
        _limited_line("limiter", lim),
        f"latency (commit to arrival, {lat['samples']} samples): p50 {lat['p50_ms']:.1f} ms, "
        f"p95 {lat['p95_ms']:.1f} ms, max {lat['max_ms']:.1f} ms",
    ]
    if "herd" in result:
        h, b = result["herd"], result["herd"]["bystander"]
        lines += [
            _limited_line("herd", h) + f"; steady {h['steady_rate']:.2f}/s, starts over "
            f"bucket {h['starts_bucket_excess']:.1f}",
            f"  backlog admitted in {h['admitted_after_s']:.1f} s, delivered after "
            f"{h['delivered_after_s']:.1f} s; meanwhile another destination's latency "
            f"p50 {b['p50_ms']:.0f} ms, max {b['max_ms']:.0f} ms ({b['samples']} samples, "
            f"inf: over {WAIT_SECONDS:.0f} s)",
        ]
    return "\n".join(lines)


def _limited_line(name: str, lim: dict[str, Any]) -> str:
    return (
        f"{name}: {lim['arrivals']} arrivals in {lim['duration_s']:.1f} s; at the receiver "
        f"the first second {lim['first_second']}, the busiest {lim['worst_1s_window']} "
        f"(R + burst = {lim['rate'] + lim['burst']})"
    )


if __name__ == "__main__":
    bench_main(
        "tests.bench.relay",
        __doc__,
        add_arguments,
        run,
        at_least_one=("messages", "rounds", "rate", "samples", "scale_rounds"),
        stopped="the receiver, the merchants and the relay were stopped",
    )
