"""The relay's bench at scale: N merchants, one relay process, against a floor in the same
run (``make bench-relay``'s scale phase; ``python -m tests.bench.relay --scale …``).

For each N, N destinations with the model's default limits (10 a second, burst 10, 4 in
flight, a 10 s timeout), each a merchant on a loopback port of its own
(relay_merchants.py: one asyncio process for all, 200 after 200 ms, keep-alive), and 20
messages each; every other destination disabled, the tables vacuumed and analysed.
Two runs against the same merchants, which goes first alternating:

- **the relay**: one ``manage.py webhook_relay`` process with the default settings
  (2 database connections, LISTEN on), started and idle; the 20·N messages admitted
  with ``enqueue_webhook`` in one transaction, so that every destination's messages are
  committed at the same instant and the relay, not the admission, is timed. Its
  notifications wake the relay. The clock starts at the commit.
- **the floor**: one plain asyncio process with aiohttp and no database
  (relay_floor.py), sending the same messages signed as the relay signs them, under
  the same limits kept in memory. The clock starts when it is told to go.

Figures for each: when the last message first arrived (from the clock's start), the
deliveries a second that makes, the process's CPU (user + system, /proc/<pid>/stat)
a delivery from the start until every message is delivered (the relay: recorded as
delivered in the table; and its PostgreSQL backends' CPU, read the same way), the
admission-to-arrival p50 and p99, and, sampled every 0.2 s from /proc and
pg_stat_activity, its peak threads, its peak RSS and (the relay) the PostgreSQL
connections it held (its connections carry an ``application_name`` of their own).
Every key's arrivals are counted: a message missing or arriving twice is a failure,
whatever the speed. Each N runs ``rounds`` times (the figures: medians, the ratios:
the median of each round's).

``--black-holes B``: a last relay run with 300 healthy merchants and B black holes
beside them (they accept the connection and never answer), the healthy merchants' p99
compared with the runs without them.

``--profile``: one more relay run at N = 300 (before the black holes), its rounds
timed and its loop's lag sampled (relay_probe.py), under py-spy attached for the
delivery span (``--py-spy PATH``, or on PATH; every thread) or, without it, under
cProfile (the loop's thread).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import environ
import psycopg

from .common import SHOP_SECRET
from .report import percentile
from .server import BASE_DIR, LoggedProcess

EVENT_TYPE = "order.paid"
HOST = "127.0.0.1"
# the relay processes' database connections say who they are in pg_stat_activity
RELAY_APPLICATION = "webhook-bench-relay"
MESSAGES_EACH = 20
SAMPLE_SECONDS = 0.2
SETTLE_SECONDS = 1.0  # after the last delivery: any second arrival of a key has come
STALL_SECONDS = 30.0  # no arrival for this long: the run has stopped delivering
# the process's requests in flight at most: the relay's RELAY_MAX_REQUESTS default, and
# the floor's own bound
MAX_REQUESTS = 1000
# the model's defaults, which the scale's destinations keep
RATE, BURST, IN_FLIGHT, TIMEOUT_S = 10, 10, 4, 10.0
DATABASE_CONNECTIONS = 2  # RELAY_DATABASE_CONNECTIONS's default; +1 listening

# targets, at TARGET_SCALE and above
TARGET_SCALE = 300
RATE_RATIO = 0.5  # relay deliveries/s >= 0.5 x the floor's
CPU_RATIO = 2.0  # relay CPU a delivery <= 2 x the floor's
BLACK_HOLE_RATIO = 2.0  # the healthy p99 beside black holes <= 2 x without
BLACK_HOLE_HEALTHY = 300


def order_payload(tag: str, i: int) -> dict[str, Any]:
    """What the demo shop sends a destination for an order that moved."""
    return {
        "type": EVENT_TYPE,
        "data": {"order_id": f"ord-{tag}-{i}", "status": "paid", "version": 1},
    }


# --- a process watched from /proc ------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of every thread of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_status(pid: int) -> dict[str, int]:
    """Threads, VmRSS and VmHWM (kB) of ``pid``."""
    found = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("Threads", "VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    return found


class Watch:
    """A process sampled every SAMPLE_SECONDS in a thread: its peak threads and RSS, and
    with ``database`` the connections carrying ``application`` in pg_stat_activity."""

    def __init__(self, pid: int, database: str | None = None, application: str = "") -> None:
        self.pid = pid
        self.threads = 0
        self.rss_kb = 0
        self.hwm_kb = 0
        self.connections = 0
        self._database = database
        self._application = application
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._sample(None)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def backends(self) -> dict[int, float]:
        """The CPU so far of each PostgreSQL backend serving ``application`` (by its pid:
        the server runs on this machine)."""
        assert self._database is not None
        with psycopg.connect(self._database, autocommit=True) as conn:
            pids = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                    [self._application],
                )
            ]
        found = {}
        for pid in pids:
            with contextlib.suppress(OSError):  # gone
                found[pid] = cpu_seconds(pid)
        return found

    def _run(self) -> None:
        conn = None
        if self._database is not None:
            conn = psycopg.connect(self._database, autocommit=True)
        try:
            while not self._stop.wait(SAMPLE_SECONDS):
                self._sample(conn)
        finally:
            if conn is not None:
                conn.close()

    def _sample(self, conn: psycopg.Connection | None) -> None:
        try:
            status = proc_status(self.pid)
        except OSError:
            return
        self.threads = max(self.threads, status.get("Threads", 0))
        self.rss_kb = max(self.rss_kb, status.get("VmRSS", 0))
        self.hwm_kb = max(self.hwm_kb, status.get("VmHWM", 0))
        if conn is not None:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [self._application],
            ).fetchone()
            self.connections = max(self.connections, row[0] if row else 0)

    def peaks(self) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "threads": self.threads,
            "rss_mb": round(max(self.rss_kb, self.hwm_kb) / 1024, 1),
        }
        if self._database is not None:
            figures["pg_connections"] = self.connections
        return figures


# --- the merchants -----------------------------------------------------------------------


class Merchants:
    """The merchants' process (relay_merchants.py) and a control connection to it."""

    def __init__(self, merchants: int, black_holes: int = 0) -> None:
        command = [sys.executable, "-m", "tests.bench.relay_merchants"]
        command += ["--merchants", str(merchants), "--black-holes", str(black_holes)]
        self.process = subprocess.Popen(
            command, cwd=BASE_DIR, stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError("the merchants did not start")
        started = json.loads(line)
        self.ports: list[int] = started["ports"]
        self.holes: list[int] = started["holes"]
        self._conn = HTTPConnection(HOST, started["control"], timeout=60)

    def _get(self, target: str) -> dict[str, Any]:
        self._conn.request("GET", target)
        return json.loads(self._conn.getresponse().read())

    def count(self) -> tuple[int, float]:
        """Arrivals so far, and the merchants' CPU seconds."""
        document = self._get("/count")
        return document["count"], document["cpu_s"]

    def drain(self) -> list[tuple[float, int, str]]:
        return [(at, n, key) for at, n, key in self._get("/arrivals")["arrivals"]]

    def stop(self) -> None:
        if hasattr(self, "_conn"):
            self._conn.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# --- a relay process ---------------------------------------------------------------------


def relay_env(env: dict[str, str], database_url: str) -> dict[str, str]:
    """A relay process's environment: the bench's settings, its connections named."""
    separator = "&" if "?" in database_url else "?"
    return env | {
        "BENCH_DATABASE_URL": f"{database_url}{separator}application_name={RELAY_APPLICATION}"
    }


def psycopg_dsn(database_url: str) -> str:
    config = environ.Env.db_url_config(database_url)
    parts = {
        "host": config.get("HOST"),
        "port": config.get("PORT"),
        "user": config.get("USER"),
        "password": config.get("PASSWORD"),
        "dbname": config["NAME"],
    }
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)


class RelayProcess(LoggedProcess):
    """``manage.py webhook_relay`` on the bench database, default settings; ready once its
    heartbeat is recorded and its listener is listening. ``probe``: the same command
    with its rounds timed and its loop's lag sampled (relay_probe.py), written there when
    it stops; ``cprofile``: run under cProfile (the loop's thread only, start-up
    included), its stats written there when it stops."""

    name = "the relay"
    startup_timeout = 60

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        database_url: str,
        *,
        probe: Path | None = None,
        cprofile: Path | None = None,
    ) -> None:
        env = relay_env(env, database_url)
        if probe is not None:
            env["BENCH_RELAY_PROBE_OUTPUT"] = str(probe)
        super().__init__(env, log_path)
        self.dsn = psycopg_dsn(database_url)
        self.probe = probe
        self.cprofile = cprofile

    def command(self) -> list[str]:
        relay = ["-m", "tests.bench.relay_probe"] if self.probe else ["manage.py", "webhook_relay"]
        if self.cprofile is not None:
            return [sys.executable, "-m", "cProfile", "-o", str(self.cprofile), *relay]
        return [sys.executable, *relay]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def ready(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                beat = conn.execute(
                    "SELECT 1 FROM webhook_receiver_heartbeat WHERE name LIKE %s",
                    [f"relay % {self.pid}"],
                ).fetchone()
                listening = conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
                    "AND query LIKE 'LISTEN %%'",
                    [RELAY_APPLICATION],
                ).fetchone()
        except psycopg.Error:
            return False
        return beat is not None and listening is not None

    def problems(self) -> list[str]:
        """Its log's warnings, errors and tracebacks."""
        text = self.log_path.read_text(errors="replace")
        return [
            line
            for line in text.splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", line)
        ]


# --- one N -------------------------------------------------------------------------------


@dataclass
class Step:
    """One N's destinations (the healthy ones, and black holes beside them) and their
    messages, by destination id: (key, payload) each."""

    n: int
    tag: str
    destinations: list[Any]
    holes: list[Any]
    messages: dict[int, list[tuple[str, dict[str, Any]]]]

    @property
    def expected(self) -> int:
        """The healthy destinations' messages: what must arrive, once each."""
        return sum(len(self.messages[d.pk]) for d in self.destinations)

    def keys(self) -> set[str]:
        return {key for d in self.destinations for key, _ in self.messages[d.pk]}


def step_create(n: int, tag: str, merchants: Merchants) -> Step:
    """A destination with the model's defaults for each merchant and black hole, 20
    messages each; every other destination disabled, so that only this step's are
    relayed (and polled)."""
    from webhook_receiver.models import WebhookDestination
    from webhook_receiver.outbound import message_key

    def made(name: str, port: int) -> Any:
        return WebhookDestination.objects.create(
            name=name,
            url=f"http://{HOST}:{port}/hooks",
            secrets=[SHOP_SECRET],
            event_types=[EVENT_TYPE],
        )

    dests = [made(f"{tag}-{i}", port) for i, port in enumerate(merchants.ports)]
    holes = [made(f"{tag}-hole-{i}", port) for i, port in enumerate(merchants.holes)]
    WebhookDestination.objects.exclude(pk__in=[d.pk for d in dests + holes]).update(enabled=False)
    messages = {}
    for d in dests + holes:
        orders = [f"{tag}-{d.pk}-{j}" for j in range(MESSAGES_EACH)]
        messages[d.pk] = [
            (message_key("order", f"ord-{o}", "paid", 1), order_payload(o, 0)) for o in orders
        ]
    return Step(n, tag, dests, holes, messages)


def analyze() -> None:
    """The tables vacuumed and their statistics gathered, as autovacuum would have done
    by now (this machine runs PostgreSQL without autovacuum); outside the timed parts.
    The statistics then see the messages of the runs before as delivered, none sending,
    as an analyze between bursts does in production."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ("webhookdestination", "outboxmessage", "deliveryattempt"):
            cursor.execute(f"VACUUM ANALYZE webhook_receiver_{table}")


@dataclass
class Context:
    env: dict[str, str]
    url: str
    results: Path
    py_spy: str | None = None

    @property
    def dsn(self) -> str:
        return psycopg_dsn(self.url)


def _wait_arrivals(merchants: Merchants, before: int, expected: int) -> int:
    """Wait until ``expected`` arrivals more than ``before`` have come, or none has for
    STALL_SECONDS; the arrivals that came."""
    seen, last_change = 0, time.monotonic()
    while seen < expected:
        time.sleep(0.05)
        count = merchants.count()[0] - before
        if count != seen:
            seen, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > STALL_SECONDS:
            break
    return seen


class PySpy:
    """py-spy attached to a running process (``record --pid --gil --nonblocking``: a
    sample every 10 ms of the thread holding the interpreter, so that the samples say
    where the process's Python time goes, waits left out, the process never paused),
    its raw stacks written to ``output`` when it is told to stop (SIGINT)."""

    def __init__(self, py_spy: str, pid: int, output: Path) -> None:
        self.output = output
        self.log = output.with_suffix(".log")
        command = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--threads"]
        command += ["--rate", "100", "--gil", "--nonblocking", "--output", str(output)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Sampling process" not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"py-spy did not attach: {self.log.read_text()[-500:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def relay_run(
    ctx: Context, step: Step, merchants: Merchants, *, profile: Path | None = None
) -> dict[str, Any]:
    """The step's messages admitted in one transaction with a relay process running; timed
    from the commit to the last first arrival, the relay's CPU until every message is
    recorded as delivered. ``profile``: py-spy attached over that span (``ctx.py_spy``),
    or the relay run under cProfile."""
    from django.db import transaction

    from webhook_receiver.models import OutboxMessage
    from webhook_receiver.outbound import enqueue_webhook

    log = ctx.results / f"relay-{step.tag}.log"
    cprofile = profile if profile is not None and not ctx.py_spy else None
    probe = profile.with_suffix(".probe.json") if profile is not None else None
    relay = RelayProcess(ctx.env, log, ctx.url, probe=probe, cprofile=cprofile)
    healthy = [d.pk for d in step.destinations]
    spy = None
    with relay, Watch(relay.pid, ctx.dsn, RELAY_APPLICATION) as watch:
        if profile is not None and ctx.py_spy:
            spy = PySpy(ctx.py_spy, relay.pid, profile)
        merchants.drain()
        before, merchant_cpu = merchants.count()
        committed: list[float] = []
        with transaction.atomic():
            # registered first: it runs first after the commit
            transaction.on_commit(lambda: committed.append(time.monotonic()))
            for d in step.destinations + step.holes:
                for key, payload in step.messages[d.pk]:
                    enqueue_webhook(d, EVENT_TYPE, key, payload, ordering_key=f"order:{key}")
            backends = watch.backends()
            cpu = watch.cpu()
        started = committed[0]
        _wait_arrivals(merchants, before, step.expected)
        # recorded: every healthy message delivered in the table
        deadline = time.monotonic() + STALL_SECONDS
        delivered = OutboxMessage.objects.filter(destination_id__in=healthy, status="delivered")
        while delivered.count() < step.expected and time.monotonic() < deadline:
            time.sleep(0.05)
        recorded_s = time.monotonic() - started
        cpu = watch.cpu() - cpu
        backends_after = watch.backends()
        if spy is not None:
            spy.stop()
        arrived, merchant_cpu_after = merchants.count()
        time.sleep(SETTLE_SECONDS)
        arrivals = merchants.drain()
    figures = run_figures(step, arrivals, started, cpu)
    messages = OutboxMessage.objects.filter(destination_id__in=healthy)
    # its connections' backends: the rounds' work on the server's side
    postgres_cpu = sum(backends_after.get(pid, at) - at for pid, at in backends.items())
    figures |= watch.peaks() | {
        "started_at": started,  # CLOCK_MONOTONIC: the commit
        "postgres_cpu_ms": postgres_cpu * 1000 / max(1, figures["arrived"]),
        "recorded_s": recorded_s,
        "not_delivered": messages.exclude(status="delivered").count(),
        "attempts_over_one": messages.filter(attempts__gt=1).count(),
        "merchant_cpu_ms": (merchant_cpu_after - merchant_cpu) * 1000 / max(1, arrived - before),
        "log": str(log),
        "log_problems": relay.problems(),
    }
    return figures


def floor_run(ctx: Context, step: Step, merchants: Merchants) -> dict[str, Any]:
    """The same messages sent by the floor process (relay_floor.py); timed from its go."""
    plan = {
        "rate": RATE,
        "burst": BURST,
        "in_flight": IN_FLIGHT,
        "timeout": TIMEOUT_S,
        "max_requests": MAX_REQUESTS,
        "destinations": [
            {"url": d.url, "secret": SHOP_SECRET, "messages": step.messages[d.pk]}
            for d in step.destinations
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(plan, file)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.relay_floor", file.name],
        cwd=BASE_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        if _line(process, 60) != "ready":
            raise RuntimeError("the floor did not start")
        with Watch(process.pid) as watch:
            merchants.drain()
            before, merchant_cpu = merchants.count()
            cpu = watch.cpu()
            started = time.monotonic()
            process.stdin.write(b"go\n")
            process.stdin.flush()
            done = json.loads(_line(process, STALL_SECONDS + step.expected / 50) or "{}")
            cpu = watch.cpu() - cpu
            arrived, merchant_cpu_after = merchants.count()
            time.sleep(SETTLE_SECONDS)
            arrivals = merchants.drain()
        process.stdin.write(b"exit\n")
        process.stdin.close()
        process.wait(30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        os.unlink(file.name)
    figures = run_figures(step, arrivals, started, cpu)
    return (
        figures
        | watch.peaks()
        | {
            "errors": done.get("errors"),
            "merchant_cpu_ms": (merchant_cpu_after - merchant_cpu)
            * 1000
            / max(1, arrived - before),
        }
    )


def _line(process: subprocess.Popen[bytes], seconds: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().decode().strip() if ready else ""


def run_figures(
    step: Step, arrivals: Sequence[tuple[float, int, str]], started: float, cpu: float
) -> dict[str, Any]:
    """What arrived: each expected key's arrivals counted, its first one timed from
    ``started``; ``cpu``: the process's CPU seconds over the run."""
    expected = step.keys()
    counts: collections.Counter[str] = collections.Counter()
    first: dict[str, float] = {}
    strays = 0
    for at, _, key in arrivals:
        if key not in expected:
            strays += 1
            continue
        counts[key] += 1
        if key not in first or at < first[key]:
            first[key] = at
    latencies = sorted((at - started) * 1000 for at in first.values())
    last_s = (max(first.values()) - started) if first else float("inf")
    return {
        "messages": step.expected,
        "arrived": len(first),
        "missing": len(expected) - len(first),
        "duplicates": sum(1 for c in counts.values() if c > 1),
        "strays": strays,
        "all_delivered_s": last_s,
        "per_s": len(first) / last_s if first else 0.0,
        "cpu_ms": cpu * 1000 / max(1, len(first)),
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
    }


# --- the phase ---------------------------------------------------------------------------


def ratios(relay: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    def ratio(name: str) -> float:
        return relay[name] / floor[name] if floor[name] else float("inf")

    names = ("all_delivered_s", "per_s", "cpu_ms", "p50_ms", "p99_ms", "threads", "rss_mb")
    return {name: ratio(name) for name in names}


# figures of a run taken over several rounds: the median, the peak, or the sum
PEAKS = ("threads", "rss_mb", "pg_connections")
SUMS = ("missing", "duplicates", "strays", "not_delivered", "attempts_over_one", "errors")


def combined(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One N's runs of one kind (relay or floor) over the rounds, as one: the median of
    each figure, the peak of the peaks, the sum of the counts."""
    figures: dict[str, Any] = {}
    for name, first in runs[0].items():
        values = [run[name] for run in runs if run.get(name) is not None]
        if name in PEAKS:
            figures[name] = max(values)
        elif name in SUMS:
            figures[name] = sum(values)
        elif name == "log_problems":
            figures[name] = [line for run in runs for line in run[name]]
        elif isinstance(first, int | float) and not isinstance(first, bool):
            figures[name] = statistics.median(values)
        else:
            figures[name] = first
    return figures


def scale(
    ctx: Context, ns: Sequence[int], rounds: int, black_holes: int, profile: bool
) -> dict[str, Any]:
    """Every N (relay and floor) ``rounds`` times, then the black holes and the profile
    if asked. Per N: the median of each figure over the rounds, and of the per-round
    ratios."""
    runs: list[list[dict[str, Any]]] = [[] for _ in ns]
    for number in range(rounds):
        if rounds > 1:
            print(f"  round {number + 1}/{rounds}", flush=True)
        for index, n in enumerate(ns):
            tag = f"r{number + 1}-n{n}" + (f"-{index + 1}" if ns.count(n) > 1 else "")
            runs[index].append(scale_round(ctx, n, tag, (number + index) % 2 == 1))
    steps = []
    for n, per_round in zip(ns, runs, strict=True):
        ratio_rounds = [r["ratios"] for r in per_round]
        steps.append(
            {
                "n": n,
                "relay": combined([r["relay"] for r in per_round]),
                "floor": combined([r["floor"] for r in per_round]),
                "ratios": {
                    name: statistics.median(r[name] for r in ratio_rounds)
                    for name in ratio_rounds[0]
                },
                "rounds": per_round,
            }
        )
    result: dict[str, Any] = {"rounds": rounds, "steps": steps}
    # the profile first: the black holes' messages stay open, and the statistics the next
    # analyze gathers would see them (the steps' see every message delivered)
    if profile:
        result["profile"] = profile_run(ctx)
    if black_holes:
        result["black_holes"] = black_hole_run(ctx, steps, black_holes)
    return result


def scale_round(ctx: Context, n: int, tag: str, floor_first: bool) -> dict[str, Any]:
    """One N once: the relay and the floor against the same merchants, in turn."""
    merchants = Merchants(n)
    try:
        step = step_create(n, tag, merchants)
        analyze()
        runs: dict[str, dict[str, Any]] = {}
        # alternate which goes first: neither always gets the machine's quieter seconds
        for which in ("floor", "relay") if floor_first else ("relay", "floor"):
            print(f"  N={n}: {which} ...", end="", flush=True)
            run = (
                relay_run(ctx, step, merchants)
                if which == "relay"
                else floor_run(ctx, step, merchants)
            )
            runs[which] = run
            print(
                f" all {run['arrived']}/{run['messages']} in {run['all_delivered_s']:.2f} s, "
                f"{run['per_s']:.0f}/s, CPU {run['cpu_ms']:.3f} ms a delivery, "
                f"p99 {run['p99_ms']:.0f} ms",
                flush=True,
            )
    finally:
        merchants.stop()
    return {**runs, "ratios": ratios(runs["relay"], runs["floor"])}


def relay_on_fresh_merchants(
    ctx: Context, n: int, tag: str, *, holes: int = 0, profile: Path | None = None
) -> tuple[dict[str, Any], Step]:
    """One relay run on merchants of its own: ``n`` healthy ones and ``holes`` black holes,
    their messages made and the tables analysed first; the run's figures and its step."""
    merchants = Merchants(n, holes)
    try:
        step = step_create(n, tag, merchants)
        analyze()
        return relay_run(ctx, step, merchants, profile=profile), step
    finally:
        merchants.stop()


def black_hole_run(ctx: Context, steps: list[dict[str, Any]], holes: int) -> dict[str, Any]:
    """BLACK_HOLE_HEALTHY healthy merchants with ``holes`` black holes beside them (their
    messages admitted in the same transaction); the healthy ones' p99 against the runs
    without them (the scale's step of the same N: its median over the rounds; or one
    run here)."""
    n = BLACK_HOLE_HEALTHY
    without = next((s["relay"] for s in steps if s["n"] == n), None)
    if without is None:
        print(f"  {n} merchants, no black hole: relay ...", flush=True)
        without, _ = relay_on_fresh_merchants(ctx, n, f"n{n}-alone")
    print(f"  {n} merchants and {holes} black holes: relay ...", end="", flush=True)
    beside, step = relay_on_fresh_merchants(ctx, n, f"n{n}-holes{holes}", holes=holes)
    from webhook_receiver.models import WebhookDestination

    # their messages go on failing and being retried: nothing after this sends to them
    WebhookDestination.objects.filter(pk__in=[h.pk for h in step.holes]).update(enabled=False)
    print(
        f" healthy {beside['arrived']}/{beside['messages']} in {beside['all_delivered_s']:.2f} s, "
        f"p99 {beside['p99_ms']:.0f} ms (without: {without['p99_ms']:.0f} ms)",
        flush=True,
    )
    return {
        "healthy": n,
        "holes": holes,
        "with": beside,
        "without": without,
        "p99_ratio": beside["p99_ms"] / without["p99_ms"],
    }


# --- the profile -------------------------------------------------------------------------

PROFILE_N = 300
PROFILE_RUNS = 3
PROFILE_TOP = 15


def profile_run(ctx: Context) -> dict[str, Any]:
    """PROFILE_RUNS relay runs at PROFILE_N, profiled (py-spy, or cProfile without it);
    their samples and their rounds taken together."""
    tool = "py-spy" if ctx.py_spy else "cProfile"
    suffix = ".txt" if ctx.py_spy else ".pstats"
    runs, outputs, spans = [], [], []
    for number in range(1, PROFILE_RUNS + 1):
        output = ctx.results / f"relay-profile-{number}{suffix}"
        print(f"  profile {number}/{PROFILE_RUNS}: N={PROFILE_N} under {tool} ...", end="")
        tag = f"n{PROFILE_N}-profile-{number}"
        run, _ = relay_on_fresh_merchants(ctx, PROFILE_N, tag, profile=output)
        print(
            f" {run['arrived']}/{run['messages']} in {run['all_delivered_s']:.2f} s, "
            f"CPU {run['cpu_ms']:.3f} ms a delivery ({output})",
            flush=True,
        )
        runs.append(run)
        outputs.append(output)
        spans.append((run["started_at"], run["started_at"] + run["recorded_s"]))
    summary = pyspy_summary(outputs) if ctx.py_spy else cprofile_summary(outputs)
    probe = probe_summary(
        [(o.with_suffix(".probe.json"), *span) for o, span in zip(outputs, spans, strict=True)]
    )
    return {
        "tool": tool,
        "outputs": [str(o) for o in outputs],
        "run": combined(runs),
        "runs": runs,
        "probe": probe,
        **summary,
    }


def probe_summary(probes: list[tuple[Path, float, float]]) -> dict[str, Any]:
    """The rounds and the loop's lag of each run between its ``start`` and ``end``
    (relay_probe.py), taken together."""
    rounds: list[list[float]] = []
    lags: list[float] = []
    span = 0.0
    for path, start, end in probes:
        document = json.loads(path.read_text())
        rounds += [r for r in document["rounds"] if r[1] >= start and r[0] <= end]
        lags += [lag * 1000 for at, lag in document["lags"] if start <= at <= end]
        span += end - start
    if not rounds:
        return {"rounds": 0}
    lags.sort()
    durations = sorted((r[1] - r[0]) * 1000 for r in rounds)
    # each run's first round: what a relay woken by N destinations at once claims
    firsts = [
        min(r for r in json.loads(path.read_text())["rounds"] if r[1] >= start)
        for path, start, _ in probes
    ]
    return {
        "runs": len(probes),
        "rounds": len(rounds),
        "span_s": span,
        "round_ms": {q: percentile(durations, p) for q, p in (("p50", 0.5), ("p90", 0.9))}
        | {"max": durations[-1]},
        "round_busy_s": sum(durations) / 1000,
        "destinations_p50": percentile(sorted(r[2] for r in rounds), 0.5),
        "destinations_max": max(r[2] for r in rounds),
        "answers_p50": percentile(sorted(r[3] for r in rounds), 0.5),
        "answers_max": max(r[3] for r in rounds),
        "first": [
            {"ms": (f[1] - f[0]) * 1000, "destinations": f[2], "claim": f[4], "claimed": f[5]}
            for f in firsts
        ],
        "lag_ms": {q: percentile(lags, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        | {"max": lags[-1] if lags else 0.0},
    }


def _function(frame: str) -> str:
    """A py-spy frame, ``name (file:line)``, as its function: ``name (file)``."""
    return re.sub(r":\d+\)$", ")", frame)


def _calls(frames: list[str], *names: str) -> bool:
    return any(frame.startswith(names) for frame in frames)


# frames under which every sample of a thread sits: left out of the cumulative list
OUTER_FRAMES = (
    "asyncio/",
    "runpy",
    "threading.py",
    "contextlib.py",
    "django/core/management",
    "relay_probe.py",
    "commands/webhook_relay.py",
    "relay_serve (",
    "DatabaseThreads._serve",
    "manage.py",
)

# the relay's parts, each a test on a sample's frames (the first: its thread)
AREAS: tuple[tuple[str, Any], ...] = (
    ("the loop's thread", lambda f: f[0].endswith("MainThread")),
    (
        "  aiohttp's request (session.post to the answer read)",
        lambda f: _calls(f, "ClientSession._request "),
    ),
    (
        "  signing (signed_request: the body's JSON, the HMAC)",
        lambda f: _calls(f, "signed_request "),
    ),
    (
        "  tracing.span and inject (no OpenTelemetry SDK set)",
        lambda f: any("core/tracing.py" in x for x in f),
    ),
    (
        "  the egress guard's literal check (literal_addresses)",
        lambda f: _calls(f, "literal_addresses "),
    ),
    (
        "  the engine's bookkeeping (_apply, _consider, _send, _start_rounds, _work)",
        lambda f: any(
            re.match(r"Relay\.(_apply|_consider|_send|_start_rounds|_work) ", x) for x in f
        ),
    ),
    ("the database threads", lambda f: "relay-db" in f[0]),
    ("  rounds (relay_round_or_apart)", lambda f: _calls(f, "relay_round_or_apart ")),
    (
        "    psycopg (sending the statement, reading its result)",
        lambda f: _calls(f, "relay_round_or_apart ") and any("psycopg/" in x for x in f),
    ),
    (
        "    JSON (the answers and states sent, the claims read)",
        lambda f: _calls(f, "relay_round_or_apart ") and _calls(f, "dumps (json", "loads (json"),
    ),
    (
        "    the outcomes (round_reported, _outcome, _claimed, _as_left)",
        lambda f: (
            _calls(f, "relay_round_or_apart ")
            and _calls(f, "round_reported ", "_outcome ", "_claimed ", "_as_left ")
        ),
    ),
    (
        "    the decisions (decide, after_answers, allowance)",
        lambda f: (
            _calls(f, "relay_round_or_apart ")
            and _calls(f, "decide ", "after_answers ", "allowance ")
        ),
    ),
    ("  the poll (due_destinations)", lambda f: _calls(f, "due_destinations ")),
)


def pyspy_summary(paths: list[Path]) -> dict[str, Any]:
    """py-spy's raw stacks (every file's together): samples by thread, by the relay's
    parts (AREAS), and the functions most sampled, on top of the stack (self) and
    anywhere in it (cumulative)."""
    threads: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = stack.split(";")
            name = frames[0].split(": ", 1)[1] if ": " in frames[0] else frames[0]
            # one pool's threads together: relay-db-0 and relay-db-1 are "relay-db"
            threads[re.sub(r"[-_]\d+$", "", name)] += count
            total += count
            for area, test in AREAS:
                if test(frames):
                    areas[area] += count
            if len(frames) > 1:
                own[_function(frames[-1])] += count
                for function in {_function(f) for f in frames[1:]}:
                    if not any(outer in function for outer in OUTER_FRAMES):
                        cumulative[function] += count
    return {
        "samples": total,
        "threads": dict(threads.most_common()),
        "areas": [(area, areas[area]) for area, _ in AREAS],
        "self": own.most_common(PROFILE_TOP),
        "cumulative": cumulative.most_common(PROFILE_TOP + 10),
    }


def cprofile_summary(paths: list[Path]) -> dict[str, Any]:
    """cProfile's stats (the loop's thread; every file's together): the functions by own
    time and by cumulative time, in seconds."""
    import pstats

    stats = pstats.Stats(*(str(p) for p in paths)).stats  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        file, line, function = key
        file = file.split("site-packages/")[-1].replace(f"{BASE_DIR}/", "")
        return f"{function} ({file}:{line})"

    rows = [(name(k), v[2], v[3]) for k, v in stats.items()]
    return {
        "samples": None,
        "threads": {},
        "areas": [],
        "self": [(n, round(t, 3)) for n, t, _ in sorted(rows, key=lambda r: -r[1])[:PROFILE_TOP]],
        "cumulative": [
            (n, round(c, 3)) for n, _, c in sorted(rows, key=lambda r: -r[2])[: PROFILE_TOP + 10]
        ],
    }


# --- checks and the table ------------------------------------------------------------------


def scale_checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    steps = result["steps"]
    checks = []
    for s in steps:
        if s["n"] < TARGET_SCALE:
            continue
        r = s["ratios"]
        checks += [
            {
                "figure": f"N={s['n']} deliveries/s",
                "value": s["relay"]["per_s"],
                "floor": s["floor"]["per_s"],
                "ratio": r["per_s"],
                "target": f">= {RATE_RATIO} x floor",
                "pass": r["per_s"] >= RATE_RATIO,
            },
            {
                "figure": f"N={s['n']} CPU ms/delivery",
                "value": s["relay"]["cpu_ms"],
                "floor": s["floor"]["cpu_ms"],
                "ratio": r["cpu_ms"],
                "target": f"<= {CPU_RATIO:g} x floor",
                "pass": r["cpu_ms"] <= CPU_RATIO,
            },
        ]
    if steps:
        connections = max(s["relay"]["pg_connections"] for s in steps)
        checks.append(
            {
                "figure": "PG connections, peak",
                "value": connections,
                "floor": None,
                "ratio": None,
                "target": f"<= {DATABASE_CONNECTIONS} + 1",
                "pass": connections <= DATABASE_CONNECTIONS + 1,
            }
        )
        first, last = steps[0], steps[-1]
        checks.append(
            {
                "figure": f"threads N={first['n']}..{last['n']}",
                "value": last["relay"]["threads"],
                "floor": first["relay"]["threads"],
                "ratio": None,
                "target": "not growing with N",
                "pass": last["relay"]["threads"] <= first["relay"]["threads"],
            }
        )
    holes = result.get("black_holes")
    if holes:
        checks.append(
            {
                "figure": f"p99 beside {holes['holes']} holes",
                "value": holes["with"]["p99_ms"],
                "floor": holes["without"]["p99_ms"],
                "ratio": holes["p99_ratio"],
                "target": f"<= {BLACK_HOLE_RATIO:g} x without",
                "pass": holes["p99_ratio"] <= BLACK_HOLE_RATIO,
            }
        )
    return checks


def scale_problems(result: dict[str, Any]) -> list[str]:
    """Messages missing or arriving twice (a failure whatever the speed), and what the
    relay's log and table say went wrong."""
    problems = []
    runs = [(f"N={s['n']} {w}", s[w]) for s in result["steps"] for w in ("relay", "floor")]
    if "black_holes" in result:
        runs.append(("black holes relay", result["black_holes"]["with"]))
    if "profile" in result:
        runs.append(("profiled relay", result["profile"]["run"]))
    for name, run in runs:
        if run["missing"]:
            problems.append(f"{name}: {run['missing']} of {run['messages']} messages never arrived")
        if run["duplicates"]:
            problems.append(f"{name}: {run['duplicates']} messages arrived more than once")
        if run.get("not_delivered"):
            problems.append(f"{name}: {run['not_delivered']} messages not delivered in the table")
        if run.get("errors"):
            problems.append(f"{name}: {run['errors']} answers were not 200")
        for line in run.get("log_problems", [])[:5]:
            problems.append(f"{name}'s log: {line}")
    return problems


def scale_render(result: dict[str, Any]) -> str:
    columns = [
        ("all in s", "all_delivered_s", 2),
        ("deliv/s", "per_s", 0),
        ("CPU ms", "cpu_ms", 3),
        ("p50 ms", "p50_ms", 0),
        ("p99 ms", "p99_ms", 0),
        ("threads", "threads", 0),
        ("RSS MB", "rss_mb", 0),
    ]
    head = f"{'N':>5} {'':<6}" + "".join(f"{c[0]:>10}" for c in columns)
    lines = [head + f"{'PG conns':>10}{'missing':>9}{'doubled':>9}", "-" * (len(head) + 28)]
    for s in result["steps"]:
        for which in ("relay", "floor", "ratios"):
            run = s[which]
            cells = "".join(
                f"{run[key]:>10.{2 if which == 'ratios' else digits}f}"
                for _, key, digits in columns
            )
            label = "ratio" if which == "ratios" else which
            tail = ""
            if which != "ratios":
                tail = (
                    f"{run.get('pg_connections', ''):>10}{run['missing']:>9}{run['duplicates']:>9}"
                )
            lines.append(f"{s['n'] if which == 'relay' else '':>5} {label:<6}{cells}{tail}")
    lines.append(
        f"(medians of {result['rounds']} rounds; CPU ms: user + system CPU of the process a "
        "delivery, from the start until every message is delivered; ratio: relay / floor, "
        "the median of the rounds' ratios; threads, RSS, PG conns: the peak)"
    )
    for s in result["steps"]:
        if len(s["rounds"]) > 1:
            lines.append(
                f"N={s['n']}: per-round ratios, deliveries/s "
                + ", ".join(f"{r['ratios']['per_s']:.2f}" for r in s["rounds"])
                + "; CPU a delivery "
                + ", ".join(f"{r['ratios']['cpu_ms']:.2f}" for r in s["rounds"])
            )
    for s in result["steps"]:
        r = s["relay"]
        lines.append(
            f"N={s['n']}: the relay recorded the last delivery {r['recorded_s']:.2f} s after "
            f"the commit; its PostgreSQL backends' CPU {r['postgres_cpu_ms']:.3f} ms a "
            f"delivery; {r['attempts_over_one']} messages took more than one attempt; "
            f"merchants' CPU {r['merchant_cpu_ms']:.3f} ms a request (floor run: "
            f"{s['floor']['merchant_cpu_ms']:.3f})"
        )
    holes = result.get("black_holes")
    if holes:
        w, wo = holes["with"], holes["without"]
        lines.append(
            f"{holes['healthy']} healthy merchants beside {holes['holes']} black holes: p50 "
            f"{w['p50_ms']:.0f} ms, p99 {w['p99_ms']:.0f} ms, all in {w['all_delivered_s']:.2f} s "
            f"(without: p50 {wo['p50_ms']:.0f} ms, p99 {wo['p99_ms']:.0f} ms, all in "
            f"{wo['all_delivered_s']:.2f} s); ratio {holes['p99_ratio']:.2f}; peak threads "
            f"{w['threads']}, PG connections {w['pg_connections']}"
        )
    profile = result.get("profile")
    if profile:
        lines += profile_render(profile)
    return "\n".join(lines)


def profile_render(profile: dict[str, Any]) -> list[str]:
    run = profile["run"]
    lines = [
        "",
        f"profile ({profile['tool']}, {len(profile['runs'])} runs at "
        f"N={run['messages'] // MESSAGES_EACH}: {run['messages']} deliveries each, all in "
        f"{run['all_delivered_s']:.2f} s, CPU {run['cpu_ms']:.3f} ms a delivery (medians); "
        f"{', '.join(profile['outputs'])})",
    ]
    probe = profile.get("probe") or {}
    if probe.get("rounds"):
        r, lag = probe["round_ms"], probe["lag_ms"]
        lines += [
            f"  rounds: {probe['rounds']} in {probe['span_s']:.2f} s, "
            f"{probe['round_busy_s']:.2f} s busy on {DATABASE_CONNECTIONS} connections; "
            f"a round {r['p50']:.1f} ms (p50), {r['p90']:.1f} (p90), {r['max']:.1f} (max); "
            f"destinations a round p50 {probe['destinations_p50']}, max "
            f"{probe['destinations_max']}; answers a round p50 {probe['answers_p50']}, max "
            f"{probe['answers_max']}",
            "  each run's first round: "
            + "; ".join(
                f"{f['destinations']} destinations, {f['claim']} messages asked, "
                f"{f['claimed']} claimed, {f['ms']:.0f} ms"
                for f in probe["first"]
            ),
            f"  the loop's lag (a 10 ms sleep's lateness): p50 {lag['p50']:.1f} ms, p90 "
            f"{lag['p90']:.1f}, p99 {lag['p99']:.1f}, max {lag['max']:.1f}",
        ]
    total = profile["samples"]
    if total:
        lines.append(
            f"  samples of the thread holding the interpreter ({total}): "
            + ", ".join(f"{t} {n} ({n / total:.0%})" for t, n in profile["threads"].items())
        )

    def share(n: float) -> str:
        return f"{n / total:5.1%}" if total else f"{n:7.3f} s"

    if profile.get("areas"):
        lines.append("  by part of the relay:")
        lines += [f"    {share(n)}  {area}" for area, n in profile["areas"]]
    lines.append("  on top of the stack (self):")
    lines += [f"    {share(n)}  {name}" for name, n in profile["self"]]
    lines.append("  anywhere in the stack (cumulative):")
    lines += [f"    {share(n)}  {name}" for name, n in profile["cumulative"]]
    return lines


def find_py_spy(given: str | None) -> str | None:
    return given or shutil.which("py-spy")
