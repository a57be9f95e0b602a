"""Benchmark of a recovery job beside live traffic, its relay process SIGKILLed halfway
(make bench-recovery; a command, not a timed test).

    python -m tests.bench.recovery [--messages N] [--rate R] [--live-rate L] [--orders K]

On a fresh ``webhook_receiver_bench_recovery`` database (BENCH_RECOVERY_DATABASE_URL),
the relay bench's receiver (relay.py: a process of its own, 200 at once, each arrival's
CLOCK_MONOTONIC time and ``webhook-id``), one destination (1,000/s, burst 100, 50 in
flight, a 5 s timeout) with N failed messages (50,000) over K orders (1,000), and one
relay process (``manage.py webhook_relay``). A recovery job of them runs at R/s (200)
while a thread admits live messages at L/s (50) with ``enqueue_webhook`` (each its own
order, a commit every 20 ms). Once half is released (or half the run's limit has gone:
N/R, a lease and 30 s), the relay is SIGKILLed and another started. The live admissions
stop when every recovered key has arrived, or at the limit; then all must be delivered
within 30 s.

Figures, against floors of the same run: plan, released and recovered keys arrived
(equal); each key that arrived twice, and whether it was ``sending`` at the kill (a
lease's at-least-once; any other would be a second release); the job's rate against R
(floor N/R s) and its busiest 5 s against R·5 + the 2 s it may release ahead; the
relay's deliveries/s against R + L; live deliveries/s during the run against live
admissions/s (≥ 0.8) and admission-to-arrival p50/p99; what the kill cost. Exits 1 on
plan ≠ run, a duplicate not leased at the kill, live < 0.8, or a run not done within
its limit. Results: bench-results/recovery.json, the relays' logs beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import threading
import time
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from tests.support.limits import worst_window

from .cli import bench_main
from .relay import Receiver, destination, with_receiver
from .relay_scale import EVENT_TYPE, RELAY_APPLICATION, RelayProcess, analyze, order_payload
from .report import percentile
from .server import RESULTS_DIR, git_commit

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_recovery"
# the destination: its limits above the job's and the live traffic's sum
DEST_RATE, DEST_BURST, DEST_IN_FLIGHT, DEST_TIMEOUT = 1000, 100, 50, 5.0
INSERT_BATCH = 5000
LIVE_TICK_SECONDS = 0.02  # the live thread commits what is due this often
SAMPLE_SECONDS = 0.25  # the runner reads the job and drains the receiver this often
WINDOW_SECONDS = 5.0
LIVE_RATIO = 0.8  # live deliveries/s during the run >= 0.8 x live admissions/s
SLACK_SECONDS = 30.0  # the run's limit beyond its floor and a lease; and the last drain's
SETTLE_SECONDS = 1.0  # after the last delivery: a second arrival of a key has come
# a row of the table; gate: it decides the exit status (else it is shown)
ROW = ("figure", "value", "floor", "ratio", "target", "pass", "gate")


class LiveAdmissions(threading.Thread):
    """Live messages at ``rate`` a second, each its own order, committed together every
    LIVE_TICK_SECONDS (a connection of its own); the commit's time by key."""

    def __init__(self, dest: Any, rate: float) -> None:
        super().__init__(daemon=True)
        self.dest, self.rate = dest, rate
        self.committed: dict[str, float] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection, transaction

        from webhook_receiver.outbound import enqueue_webhook

        started, n = time.monotonic(), 0
        try:
            while not self.stopping.is_set():
                due = range(n, int((time.monotonic() - started) * self.rate))
                if due:
                    with transaction.atomic():
                        for i in due:
                            enqueue_webhook(
                                self.dest, EVENT_TYPE, f"live-{i}", order_payload("live", i),
                                ordering_key=f"live:{i}",
                            )  # fmt: skip
                    at = time.monotonic()  # committed: its notification has gone
                    self.committed.update((f"live-{i}", at) for i in due)
                    n = due.stop
                time.sleep(LIVE_TICK_SECONDS)
        except BaseException as exc:  # reported by the runner, which goes on to its end
            self.error = exc
        finally:
            connection.close()


def failed_messages(dest: Any, count: int, orders: int) -> None:
    """``count`` failed messages (a merchant that was down half an hour ago), their
    ordering keys taken in turn from ``orders`` orders."""
    from django.utils import timezone

    from webhook_receiver.models import OutboxMessage

    at = timezone.now() - timedelta(minutes=30)
    common = {"destination": dest, "event_type": EVENT_TYPE, "status": "failed",
              "attempts": 12, "failures": 12, "last_status_code": 503,
              "next_attempt_at": at, "created_at": at}  # fmt: skip
    for first in range(0, count, INSERT_BATCH):
        batch = []
        for i in range(first, min(first + INSERT_BATCH, count)):
            key, payload, order = f"rec-{i:06d}", order_payload("rec", i), f"order:{i % orders}"
            batch.append(OutboxMessage(key=key, payload=payload, ordering_key=order, **common))
        OutboxMessage.objects.bulk_create(batch)


def until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(condition())


# --- the run -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=50_000, help="failed messages")
    # within what one relay process delivers on a 2-core machine (docs/benchmarks.md)
    parser.add_argument("--rate", type=int, default=200, help="the job's rate, a second")
    parser.add_argument("--live-rate", type=int, default=50, help="live admissions a second")
    parser.add_argument("--orders", type=int, default=1000, help="the failed ones' orders")
    parser.add_argument("--output", default=str(RESULTS_DIR / "recovery.json"))


def run(args: argparse.Namespace) -> int:
    url = os.environ.get("BENCH_RECOVERY_DATABASE_URL", DEFAULT_URL)
    return with_receiver(url, lambda env, receiver: _run(args, env, url, receiver))


def _run(args: argparse.Namespace, env: dict[str, str], url: str, receiver: Receiver) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    from webhook_receiver.models import OutboxMessage, RecoveryJob
    from webhook_receiver.outbound.recovery import Criteria, recovery_start
    from webhook_receiver.outbound.recovery_run import RELEASED_AHEAD_SECONDS
    from webhook_receiver.outbound.relay.writes import lease_margin
    from webhook_receiver.outbound.tenancy import EVERY_TENANT

    # the live messages' type need not be declared in the catalog
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": "off"}
    call_command("migrate", verbosity=0)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    dest = destination(
        "recovering", receiver.url, rate_count=DEST_RATE, burst=DEST_BURST,
        max_in_flight=DEST_IN_FLIGHT, timeout_seconds=DEST_TIMEOUT,
    )  # fmt: skip
    print(f"{args.messages} failed messages over {args.orders} orders ...", flush=True)
    failed_messages(dest, args.messages, args.orders)
    analyze()
    lease = DEST_TIMEOUT + lease_margin().total_seconds()
    limit = args.messages / args.rate + lease + SLACK_SECONDS

    arrivals: list[tuple[float, str]] = []
    released: list[tuple[float, int]] = []  # (time, job.released), sampled
    live = LiveAdmissions(dest, args.live_rate)
    kill: dict[str, Any] = {}
    with ExitStack() as stack:
        first = stack.enter_context(RelayProcess(env, RESULTS_DIR / "recovery-relay1.log", url))
        print(
            f"recovery at {args.rate}/s beside live messages at {args.live_rate}/s, at most "
            f"{limit:.0f} s; the relay SIGKILLed at half ...",
            flush=True,
        )
        since = timezone.now() - timedelta(hours=1)
        job = recovery_start(
            scope=EVERY_TENANT, destination=dest, criteria=Criteria(kind="recover", since=since),
            by="bench", rate=args.rate,
        )  # fmt: skip
        started = time.monotonic()
        live.start()
        recovered: set[str] = set()
        while len(recovered) < job.planned and time.monotonic() < started + limit:
            time.sleep(SAMPLE_SECONDS)
            got = receiver.drain()[0]
            arrivals += got
            recovered.update(key for _, key in got if key.startswith("rec-"))
            released.append((time.monotonic(), RecoveryJob.objects.get(pk=job.pk).released))
            half = released[-1][1] >= job.planned // 2 or time.monotonic() > started + limit / 2
            if not kill and half:
                kill = kill_and_restart(first, stack, env, url, dest)
                at = kill["at"] - started
                print(f"  killed after {at:.1f} s, {kill['released']} released", flush=True)
        live.stopping.set()
        live.join(30)
        stopped = time.monotonic()
        # every message recorded delivered
        open_ = OutboxMessage.objects.filter(destination=dest).exclude(status="delivered")
        finished = until(lambda: not open_.exists(), SLACK_SECONDS)
        left_open = dict(Counter(open_.values_list("status", flat=True)))
        time.sleep(SETTLE_SECONDS)
        arrivals += receiver.drain()[0]
        relay_problems = first.problems() + (kill["second"].problems() if kill else [])
    job.refresh_from_db()

    ahead = math.ceil(args.rate * RELEASED_AHEAD_SECONDS)
    result = figures(args, job, arrivals, released, live, kill, started, stopped, ahead)
    result.update(lease_s=lease, limit_s=limit, finished=finished, left_open=left_open)
    checks, problems = judged(result, args)
    if live.error is not None:
        problems.append(f"the live admissions stopped: {live.error!r}")
    print()
    print(render(result, checks, problems, relay_problems))
    config = {"commit": git_commit(), **vars(args), "cpu_count": os.cpu_count()}
    document = {"config": config, "result": result, "checks": checks, "problems": problems}
    with open(args.output, "w") as out:
        out.write(json.dumps(document | {"relay_log": relay_problems[:20]}, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0 if all(c["pass"] for c in checks if c["gate"]) and not problems else 1


def kill_and_restart(
    first: RelayProcess, stack: ExitStack, env: dict[str, str], url: str, dest: Any
) -> dict[str, Any]:
    """SIGKILL the relay (its process group), read what it left ``sending`` once its
    connections are gone, start the next; what was seen, and when."""
    from django.db import connection
    from django.utils import timezone

    from webhook_receiver.models import OutboxMessage, RecoveryJob

    def relay_backends() -> int:
        # a killed relay's connections end once PostgreSQL sees them closed (a statement
        # it was running has finished or rolled back by then)
        with connection.cursor() as cursor:
            sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            cursor.execute(sql, [RELAY_APPLICATION])
            return cursor.fetchone()[0]

    assert first.process is not None
    os.killpg(first.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    first.process.wait()
    if not until(lambda: relay_backends() == 0, 10):
        raise RuntimeError("the killed relay's connections did not end")
    held = OutboxMessage.objects.filter(destination=dest, status="sending")
    sending = dict(held.values_list("key", "lease_until"))
    now = timezone.now()
    return {
        "at": killed,
        "released": RecoveryJob.objects.get(destination=dest).released,
        "sending": sorted(sending),
        "lease_left_s": max(((t - now).total_seconds() for t in sending.values()), default=0),
        "second": stack.enter_context(RelayProcess(env, RESULTS_DIR / "recovery-relay2.log", url)),
        "ready_after_s": time.monotonic() - killed,
    }


# --- the figures ---------------------------------------------------------------------


def figures(
    args: argparse.Namespace, job: Any, arrivals: list[tuple[float, str]],
    released: list[tuple[float, int]], live: LiveAdmissions, kill: dict[str, Any],
    started: float, stopped: float, ahead: int,
) -> dict[str, Any]:  # fmt: skip
    counts = Counter(key for _, key in arrivals)
    killed = kill.get("at", math.inf)
    first: dict[str, float] = {}
    first_after_kill: dict[str, float] = {}
    for at, key in sorted(arrivals):
        first.setdefault(key, at)
        if at > killed:
            first_after_kill.setdefault(key, at)
    rec = sorted(at for key, at in first.items() if key.startswith("rec-"))
    duration = (rec[-1] - started) if rec else math.inf
    sending = set(kill.get("sending", ()))
    committed = live.committed
    waits = {key: first[key] - at for key, at in committed.items() if key in first}
    span = stopped - started
    after_kill = sorted(at for at, _ in arrivals if at > killed)
    # when each message the dead relay held came again (its lease ran out)
    back = [first_after_kill[key] - killed for key in sending if key in first_after_kill]
    return {
        "planned": job.planned,
        "released": job.released,
        "state": job.state,
        "recovered_arrived": len(rec),
        "twice": [
            {"key": key, "times": n, "sending_at_kill": key in sending}
            for key, n in sorted(counts.items())
            if n > 1
        ],
        "duration_s": duration,
        "ideal_s": job.planned / args.rate,
        "achieved_rate": len(rec) / duration,
        "busiest_window": worst_window(rec, WINDOW_SECONDS),
        "busiest_release_window": release_window(released, WINDOW_SECONDS),
        "window_allowed": args.rate * WINDOW_SECONDS + ahead,
        "delivered_per_s": sum(1 for at in first.values() if at <= stopped) / span,
        "live_admitted": len(committed),
        "live_arrived": len(waits),
        "live_admitted_per_s": len(committed) / span,
        "live_delivered_per_s": sum(1 for key in committed if first.get(key, math.inf) <= stopped)
        / span,
        "live_p50_ms": percentile(list(waits.values()), 0.50) * 1000,
        "live_p99_ms": percentile(list(waits.values()), 0.99) * 1000,
        "live_max_ms": max(waits.values(), default=math.nan) * 1000,
        "live_before_kill_p99_ms": 1000
        * percentile([w for k, w in waits.items() if committed[k] < killed], 0.99),
        "run_s": span,
        "killed_after_s": killed - started,
        "released_at_kill": kill.get("released"),
        "sending_at_kill": len(sending),
        "restart_s": kill.get("ready_after_s", math.nan),
        "first_arrival_after_kill_s": (after_kill[0] - killed) if after_kill else math.nan,
        "longest_gap_s": max(
            (b - a for a, b in zip(after_kill, after_kill[1:], strict=False)), default=0.0
        ),
        "leased_back_after_s": max(back, default=math.nan),
        "lease_left_at_kill_s": kill.get("lease_left_s", math.nan),
    }


def release_window(samples: list[tuple[float, int]], span: float) -> int:
    """The most the job released in any ``span`` seconds, read off the samples (each
    window a sample's spacing wider than ``span``)."""
    worst, j = 0, 0
    for i, (t, _) in enumerate(samples):
        while j + 1 < len(samples) and samples[j + 1][0] - t <= span:
            j += 1
        worst = max(worst, samples[j][1] - (samples[i - 1][1] if i else 0))
    return worst


def judged(r: dict[str, Any], args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    live_ratio = r["live_delivered_per_s"] / r["live_admitted_per_s"]
    not_leased = [t for t in r["twice"] if not t["sending_at_kill"]]
    plan_run = r["planned"] == r["released"] == r["recovered_arrived"] == args.messages
    rate, demand = args.rate, args.rate + args.live_rate
    rate5 = rate * WINDOW_SECONDS
    rows = [
        ("plan = released = arrived", r["recovered_arrived"], r["planned"],
            r["recovered_arrived"] / r["planned"], "equal", plan_run, True),
        ("duplicates not leased", len(not_leased), None, None, "0", not not_leased, True),
        ("live deliveries/s", r["live_delivered_per_s"], r["live_admitted_per_s"],
            live_ratio, f">= {LIVE_RATIO} x admitted", live_ratio >= LIVE_RATIO, True),
        ("recovery rate/s", r["achieved_rate"], rate, r["achieved_rate"] / rate,
            "R (floor: N/R s)", r["achieved_rate"] <= rate * 1.01, False),
        ("busiest 5 s, arrivals", r["busiest_window"], rate5, r["busiest_window"] / rate5,
            f"<= R*5 + {r['window_allowed'] - rate5:.0f}",
            r["busiest_window"] <= r["window_allowed"], False),
        ("busiest 5 s, released", r["busiest_release_window"], rate5,
            r["busiest_release_window"] / rate5, "the same, +R/4",
            r["busiest_release_window"] <= r["window_allowed"] + rate * SAMPLE_SECONDS, False),
        ("relay deliveries/s", r["delivered_per_s"], demand, r["delivered_per_s"] / demand,
            "R + L asked", r["delivered_per_s"] >= 0.95 * demand, False),
    ]  # fmt: skip
    checks = [dict(zip(ROW, row, strict=True)) for row in rows]
    problems = []
    if not r["finished"]:
        problems.append(
            f"not finished within {r['limit_s']:.0f} s + {SLACK_SECONDS:.0f} s: "
            f"{r['left_open']} of the destination's messages still open"
        )
    if r["live_arrived"] != r["live_admitted"]:
        problems.append(f"{r['live_admitted'] - r['live_arrived']} live messages never arrived")
    return checks, problems


def render(
    r: dict[str, Any], checks: list[dict[str, Any]], problems: list[str], relay_log: list[str]
) -> str:
    def cell(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    lines = [
        f"{'figure':<28}{'value':>10}{'floor':>10}{'ratio':>8}  {'target':<24}result",
        "-" * 88,
    ]
    for c in checks:
        verdict = ("pass" if c["pass"] else "FAIL") if c["gate"] else ("ok" if c["pass"] else "off")
        lines.append(
            f"{c['figure']:<28}{cell(c['value'], 2):>10}{cell(c['floor'], 2):>10}"
            f"{cell(c['ratio'], 2):>8}  {c['target']:<24}{verdict}"
        )
    twice = r["twice"]
    lines += [
        "",
        f"plan {r['planned']}, released {r['released']}, recovered keys arrived "
        f"{r['recovered_arrived']}; the job {r['state']}",
        f"recovery: {r['duration_s']:.1f} s from its start to its last arrival, the floor "
        f"{r['ideal_s']:.1f} s (planned / rate): {r['duration_s'] - r['ideal_s']:.1f} s over",
        f"  busiest 5 s: {r['busiest_window']} arrivals, {r['busiest_release_window']} released "
        f"(R*5 + 2 s ahead = {r['window_allowed']:.0f})",
        f"keys that arrived twice: {len(twice)}, of which sending at the kill: "
        f"{sum(t['sending_at_kill'] for t in twice)}",
        *(
            f"  {t['key']} x{t['times']}: "
            f"{'sending at the kill (its lease)' if t['sending_at_kill'] else 'NOT LEASED'}"
            for t in twice[:10]
        ),  # fmt: skip
        f"live: {r['live_admitted']} admitted in {r['run_s']:.1f} s "
        f"({r['live_admitted_per_s']:.1f}/s), {r['live_delivered_per_s']:.1f}/s delivered in "
        f"that span, {r['live_arrived']} arrived in all; their admission to arrival p50 "
        f"{r['live_p50_ms']:.0f} ms, p99 {r['live_p99_ms']:.0f} ms, max {r['live_max_ms']:.0f} ms "
        f"(admitted before the kill: p99 {r['live_before_kill_p99_ms']:.0f} ms)",
        f"the kill after {r['killed_after_s']:.1f} s: at {r['released_at_kill']} released, "
        f"{r['sending_at_kill']} messages sending (leases of {r['lease_s']:.0f} s, "
        f"{r['lease_left_at_kill_s']:.1f} s left); the next relay ready after "
        f"{r['restart_s']:.1f} s, the first arrival after {r['first_arrival_after_kill_s']:.1f} s,"
        f" the longest gap between arrivals {r['longest_gap_s']:.1f} s; the leased keys back "
        f"after {r['leased_back_after_s']:.1f} s",
    ]
    if relay_log:
        lines.append(f"the relays' logs: {len(relay_log)} warning/error lines, the first:")
        lines += [f"  {line[:160]}" for line in relay_log[:5]]
    lines += [f"!!! {p}" for p in problems]
    return "\n".join(lines)


if __name__ == "__main__":
    bench_main(
        "tests.bench.recovery",
        __doc__,
        add_arguments,
        run,
        at_least_one=("messages", "rate", "live_rate", "orders"),
        stopped="the receiver and the relays were stopped",
    )
