"""Draining a backlog: the retry sweeper's rate beside the receive path's.

    python -m tests.bench.drain [--backlog N] [--rounds R] [--workers 1 2] [--no-celery]

A backlog of N due failed events (``inventory.reserved`` bodies as the receive bench
sends, two ledger lines each, inserted directly as FailedEvent rows "retrying" with
``next_attempt_at`` in the past) is drained by W processes at once, each calling
``retry_failed_events()`` with its default limit in a loop, as the Celery task does
(another call while a batch comes back full). W = 1 and W = 2 by default; with W > 1
``SKIP LOCKED`` shares the backlog out. Each round also runs one phase of N new events
through the full path under gunicorn (2 sync workers), in an order that rotates, so each
drain has a receive figure measured seconds from it: the ratio reported is the drain's
rate per process to the receive rate per gunicorn worker (new events req/s / 2), the
median of the per-round ratios. Every drain is checked: N receipts, 2 ledger rows an
event, every failed event resolved, none left due.

Then, once, the same backlog through the real task: ``celery -A project worker`` (prefork,
2 children, Redis db 12, no beat), ``retry_failed_events`` enqueued once and timed until
no due row remains.

Run alone, it recreates the bench database and starts its own gunicorn;
``python -m tests.bench.run`` runs it after the receive rounds, on the same server.
Writes bench-results/drain.json.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .cli import bench_main
from .common import DEFAULT_DATABASE_URL, FULL_PATH
from .load import event_bodies, run_phase, signed_requests
from .report import write_section
from .server import (
    RESULTS_DIR,
    GunicornServer,
    LoggedProcess,
    _connect,
    bench_env,
    database_analyze,
    database_prepare,
    git_commit,
)

BROKER_URL = os.environ.get("BENCH_DRAIN_BROKER_URL", "redis://127.0.0.1:6379/12")
CELERY_CONCURRENCY = 2
DRAIN_TIMEOUT_SECONDS = 300  # a drain of the default backlog takes seconds
WARMUP_EVENTS = 300
RECEIVE = "receive"
TASK_NAME = "webhook_receiver.retry_failed_events"
LEDGER_LINES = 2  # event_bodies: two lines an event, one ledger row each

# The backlog, straight into the table: as failure_capture leaves a transient failure
# (one attempt, one error on record), due a minute ago. $keys and $bodies: arrays.
BACKLOG_INSERT = """
    INSERT INTO webhook_receiver_failedevent (
        source, event_key, event_type, message_id, signature_timestamp, body, headers,
        status, attempts, errors, last_error_class, last_error_message, first_attempt_at,
        last_attempt_at, next_attempt_at, resolution, resolved_at, last_replayed_by,
        last_replayed_at, discarded_by, discarded_at, discard_reason, updated_at
    )
    SELECT 'shop', k, 'inventory.reserved', k, now() - interval '10 minutes', b,
        jsonb_build_object('content-type', 'application/json', 'webhook-id', k,
            'webhook-timestamp', extract(epoch FROM now())::bigint::text,
            'webhook-signature', '[redacted]'),
        'retrying', 1,
        jsonb_build_array(jsonb_build_object('attempt', 1, 'at', now()::text,
            'trigger', 'delivery', 'kind', 'transient',
            'exception', 'django.db.utils.OperationalError',
            'message', 'server closed the connection unexpectedly', 'traceback', '')),
        'django.db.utils.OperationalError', 'server closed the connection unexpectedly',
        now() - interval '10 minutes', now() - interval '10 minutes',
        now() - interval '1 minute', '', NULL, '', NULL, '', NULL, '', now()
    FROM unnest(%(keys)s::text[], %(bodies)s::bytea[]) AS t(k, b)
"""


@dataclass(frozen=True)
class Drain:
    workers: int
    events: int
    tried: int
    calls: int
    elapsed_s: float
    rate: float  # events a second, all processes together
    per_process: float
    cpu_ms_per_event: float  # the drainers' own CPU (Python), not PostgreSQL's
    problems: list[str]


# --- the backlog and its check -------------------------------------------------------


def backlog_keys(tag: str, count: int) -> list[str]:
    return [f"msg_drain_{tag}_{i}" for i in range(count)]


def backlog_insert(database_url: str, tag: str, count: int) -> None:
    """N due failed events; then VACUUM ANALYZE, as autovacuum would after such a change
    (this machine's PostgreSQL runs without it): the sweep's plan needs statistics."""
    keys = backlog_keys(tag, count)
    with _connect(database_url) as conn:
        conn.execute(BACKLOG_INSERT, {"keys": keys, "bodies": event_bodies(count, tag)})
        conn.execute("VACUUM ANALYZE webhook_receiver_failedevent")


def due_count(conn: Any) -> int:
    return conn.execute(
        "SELECT count(*) FROM webhook_receiver_failedevent "
        "WHERE status = 'retrying' AND next_attempt_at <= now()"
    ).fetchone()[0]


def backlog_check(database_url: str, tag: str, count: int) -> list[str]:
    """Every event applied exactly once: what is wrong, or nothing."""
    pattern = f"msg\\_drain\\_{tag}\\_%"
    with _connect(database_url) as conn:
        receipts, applied = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'applied') "
            "FROM webhook_receiver_webhookreceipt WHERE event_key LIKE %s",
            (pattern,),
        ).fetchone()
        ledger, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT event_key) FROM shop_inventoryledgerentry "
            "WHERE event_key LIKE %s",
            (pattern,),
        ).fetchone()
        statuses = dict(
            conn.execute(
                "SELECT status, count(*) FROM webhook_receiver_failedevent "
                "WHERE event_key LIKE %s GROUP BY status",
                (pattern,),
            ).fetchall()
        )
        due = due_count(conn)
    problems = []
    if receipts != count or applied != count:
        problems.append(f"{receipts} receipts ({applied} applied), {count} expected")
    if ledger != LEDGER_LINES * count or distinct != count:
        problems.append(
            f"{ledger} ledger rows for {distinct} events, {LEDGER_LINES * count} expected"
        )
    if statuses != {"resolved": count}:
        problems.append(f"failed events by status {statuses}, all {count} resolved expected")
    if due:
        problems.append(f"{due} failed events still due")
    return problems


# --- the drainers: processes that call the sweep as the task does ---------------------


def _drainer(env: dict[str, str], pipe: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner stops us
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connection

    from webhook_receiver.conf import app_settings
    from webhook_receiver.inbound.failures import retry_failed_events

    batch = app_settings().sweep_batch_size
    connection.ensure_connection()
    pipe.send(("ready", batch))
    while pipe.recv() == "go":
        tried = calls = 0
        cpu = time.process_time()
        started = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        try:
            while True:  # as retry_failed_events: another run while batches come back full
                count = retry_failed_events()
                tried, calls = tried + count, calls + 1
                if count < batch:
                    break
        except Exception as exc:  # reported, not left hanging
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        pipe.send(("done", started, time.perf_counter(), tried, calls, time.process_time() - cpu))


class Drainers:
    """W processes with Django set up on the bench database, started once, each waiting
    for a "go" (their start-up stays outside every measurement)."""

    def __init__(self, env: dict[str, str], count: int) -> None:
        context = mp.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes = []
        for _ in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_drainer, args=(env, theirs), daemon=True)
            self.pipes.append(ours)
            self.processes.append(process)

    def __enter__(self) -> Drainers:
        try:
            for process in self.processes:
                process.start()
            for pipe in self.pipes:
                if not pipe.poll(60):
                    raise RuntimeError("a drainer did not start within 60 s")
                pipe.recv()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send("stop")
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)

    def drain(self, workers: int, events: int) -> Drain:
        pipes = self.pipes[:workers]
        for pipe in pipes:
            pipe.send("go")
        replies = []
        for pipe in pipes:
            if not pipe.poll(DRAIN_TIMEOUT_SECONDS):
                raise RuntimeError(f"a drain did not end within {DRAIN_TIMEOUT_SECONDS} s")
            replies.append(pipe.recv())
        problems = [reply[1] for reply in replies if reply[0] == "error"]
        done = [reply for reply in replies if reply[0] == "done"]
        elapsed = max(r[2] for r in done) - min(r[1] for r in done) if done else 0.0
        rate = events / elapsed if elapsed else 0.0
        return Drain(
            workers=workers,
            events=events,
            tried=sum(r[3] for r in done),
            calls=sum(r[4] for r in done),
            elapsed_s=elapsed,
            rate=rate,
            per_process=rate / workers,
            cpu_ms_per_event=sum(r[5] for r in done) * 1000 / events,
            problems=problems,
        )


# --- the rounds ------------------------------------------------------------------------


def receive_phase(server: GunicornServer, bodies: list[bytes], tag: str) -> tuple[float, int]:
    """The full path's new events: (req/s, errors)."""
    requests = signed_requests(
        host=f"{server.host}:{server.port}",
        path=FULL_PATH,
        bodies=bodies,
        msg_prefix=f"msg_full_{tag}",
        expected_status="applied",
    )
    result = run_phase(server.host, server.port, requests, concurrency=4)
    return result.requests / result.elapsed_s if result.elapsed_s else 0.0, result.errors


def drain_rounds(
    args: argparse.Namespace, server: GunicornServer, database_url: str
) -> dict[str, Any]:
    """Interleaved rounds: the full path's new events, and a drain for each W."""
    env = drainer_env(database_url)
    kinds = [RECEIVE, *(f"drain-{w}" for w in args.workers)]
    receive: list[float] = []
    drains: dict[int, list[Drain]] = {w: [] for w in args.workers}
    errors = 0
    with Drainers(env, max(args.workers)) as drainers:
        # warm-up: each drainer's first batches (plans, caches), figures discarded
        for workers in sorted(set(args.workers)):
            backlog_insert(database_url, f"warmup{workers}", WARMUP_EVENTS)
            drainers.drain(workers, WARMUP_EVENTS)
        for number in range(args.drain_rounds):
            shift = number % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                tag = f"d{number}{kind.replace('-', '')}"
                if kind == RECEIVE:
                    rps, failed = receive_phase(server, event_bodies(args.backlog, tag), tag)
                    receive.append(rps)
                    errors += failed
                    line = f"{rps:8.1f} req/s  ({rps / 2:.1f} a gunicorn worker)"
                else:
                    workers = int(kind.split("-")[1])
                    backlog_insert(database_url, tag, args.backlog)
                    drain = drainers.drain(workers, args.backlog)
                    drain.problems.extend(backlog_check(database_url, tag, args.backlog))
                    drains[workers].append(drain)
                    wrong = "  !! " + "; ".join(drain.problems) if drain.problems else ""
                    line = (
                        f"{drain.rate:8.1f} events/s ({drain.per_process:.1f} a process, "
                        f"{drain.calls} calls){wrong}"
                    )
                print(f"  round {number + 1}/{args.drain_rounds} {kind:<8} {line}", flush=True)
    return {"receive_rps": receive, "receive_errors": errors, "drains": drains}


def summary(rounds: dict[str, Any]) -> dict[str, Any]:
    receive = rounds["receive_rps"]
    per_worker = [rps / 2 for rps in receive]
    out: dict[str, Any] = {
        "receive_rps": {"median": statistics.median(receive), "per_round": receive},
        "receive_per_worker": statistics.median(per_worker),
        "drains": {},
    }
    for workers, drains in rounds["drains"].items():
        ratios = [d.per_process / w for d, w in zip(drains, per_worker, strict=True)]
        out["drains"][workers] = {
            "rate": _spread([d.rate for d in drains]),
            "per_process": _spread([d.per_process for d in drains]),
            "cpu_ms_per_event": statistics.median(d.cpu_ms_per_event for d in drains),
            "ratio_per_process_to_receive_per_worker": _spread(ratios),
            "problems": [p for d in drains for p in d.problems],
            "rounds": [asdict(d) for d in drains],
        }
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "per_round": values,
    }


# --- the real task on a real worker -----------------------------------------------------


class CeleryWorker(LoggedProcess):
    """``celery -A project worker`` on the bench database, Redis db 12, no beat."""

    name = "the Celery worker"
    startup_timeout = 60

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "project", "worker",
            "--pool", "prefork", "--concurrency", str(CELERY_CONCURRENCY),
            "--loglevel", "INFO", "--without-mingle", "--without-gossip",
        ]  # fmt: skip

    def ready(self) -> bool:
        return " ready." in self.log_path.read_text(errors="replace")

    def task_runs(self) -> int:
        text = self.log_path.read_text(errors="replace")
        return sum(
            1 for line in text.splitlines() if f"{TASK_NAME}[" in line and " succeeded in " in line
        )


def celery_drain(database_url: str, events: int) -> dict[str, Any]:
    """The backlog through ``retry_failed_events`` on a real worker: enqueued once, timed
    from the enqueue until no due row remains."""
    import redis
    from celery import Celery

    env = drainer_env(database_url) | {"CELERY_BROKER_URL": BROKER_URL}
    broker = redis.Redis.from_url(BROKER_URL)
    broker.flushdb()  # db 12: this bench's own
    tag = "celery"
    log = RESULTS_DIR / "drain-worker.log"
    try:
        with CeleryWorker(env, log) as worker:
            backlog_insert(database_url, tag, events)
            sender = Celery(broker=BROKER_URL)
            with _connect(database_url) as conn:
                started = time.perf_counter()
                sender.send_task(TASK_NAME)
                deadline = started + DRAIN_TIMEOUT_SECONDS
                while due_count(conn) and time.perf_counter() < deadline:
                    time.sleep(0.05)
                elapsed = time.perf_counter() - started
                left = due_count(conn)
            time.sleep(1.0)  # the last run's log line
            runs = worker.task_runs()
            queued = broker.llen("celery")
    finally:
        broker.flushdb()
        broker.close()
    problems = [f"{left} still due after {DRAIN_TIMEOUT_SECONDS} s"] if left else []
    problems += backlog_check(database_url, tag, events)
    return {
        "events": events,
        "elapsed_s": elapsed,
        "rate": events / elapsed,
        "task_runs": runs,
        "queued_after": queued,
        "worker_concurrency": CELERY_CONCURRENCY,
        "problems": problems,
    }


# --- the report ------------------------------------------------------------------------


# docs/benchmarks.md's table: a backlog of N takes N / (W x rate a process).
PROJECTED_BACKLOGS = (10_000, 100_000, 1_000_000)
PROJECTED_WORKERS = (1, 2, 4)


def projection(result: dict[str, Any]) -> dict[str, Any]:
    """Minutes for each backlog and W: a measured W at its measured rate a process; any
    other at one process's rate, times W (ideal scaling: each process with a core of its
    own and PostgreSQL with more; on this 2-core machine, shared with PostgreSQL, W = 2
    already runs out of cores)."""
    measured = {int(w): d["per_process"]["median"] for w, d in result["drains"].items()}
    single = measured.get(1, min(measured.values()))
    table = {}
    for workers in PROJECTED_WORKERS:
        rate = measured.get(workers, single)
        table[workers] = {
            "per_process": rate,
            "measured": workers in measured,
            "minutes": {n: n / (workers * rate) / 60 for n in PROJECTED_BACKLOGS},
        }
    return table


def render(result: dict[str, Any], config: dict[str, Any]) -> str:
    receive = result["receive_rps"]
    lines = [
        f"drain benchmark: a backlog of {config['backlog']} due failed events, "
        f"median of {config['rounds']} interleaved rounds (min-max in brackets)",
        f"  full path, new events: {receive['median']:.1f} req/s "
        f"[{min(receive['per_round']):.0f}-{max(receive['per_round']):.0f}], "
        f"{result['receive_per_worker']:.1f} a gunicorn worker",
    ]
    for workers, d in result["drains"].items():
        r, p, ratio = d["rate"], d["per_process"], d["ratio_per_process_to_receive_per_worker"]
        lines.append(
            f"  drain, W={workers}: {r['median']:7.1f} events/s [{r['min']:.0f}-{r['max']:.0f}], "
            f"{p['median']:.1f} a process, {d['cpu_ms_per_event']:.2f} ms drainer CPU an event"
        )
        verdict = "PASS" if ratio["median"] >= 1.0 else "BELOW"
        lines.append(
            f"    drain a process / receive a worker: {ratio['median']:.2f} "
            f"[{ratio['min']:.2f}-{ratio['max']:.2f}]  target >= 1.00 {verdict}"
        )
        if d["problems"]:
            lines.append(f"    !! {len(d['problems'])} problems: {d['problems'][:3]}")
        else:
            lines.append("    every event applied once: receipts, ledger rows, all resolved")
    if "celery" in result:
        c = result["celery"]
        if "skipped" in c:
            lines.append(f"  Celery: skipped ({c['skipped']})")
        else:
            single = result["drains"].get(1, {}).get("rate", {}).get("median")
            against = f", {c['rate'] / single:.2f} of the W=1 loop" if single else ""
            lines.append(
                f"  Celery task, one enqueue, worker prefork {c['worker_concurrency']}: "
                f"{c['events']} events in {c['elapsed_s']:.1f} s = {c['rate']:.1f} events/s"
                f"{against}; {c['task_runs']} task runs, {c['queued_after']} queued after"
            )
            lines.append(
                "    " + ("; ".join(c["problems"]) if c["problems"] else "every event applied once")
            )
    lines += ["", "a backlog of N takes about N / (W x rate a process):"]
    head = "  W  rate/process  " + "".join(f"{f'N={n:,}':>14}" for n in PROJECTED_BACKLOGS)
    lines.append(head)
    for workers, row in result["projection"].items():
        cells = "".join(f"{_duration(row['minutes'][n]):>14}" for n in PROJECTED_BACKLOGS)
        how = "measured" if row["measured"] else "extrapolated: ideal scaling"
        lines.append(f"  {workers}  {row['per_process']:8.1f}/s    {cells}   ({how} rate)")
    return "\n".join(lines)


def _duration(minutes: float) -> str:
    if minutes < 1:
        return f"{minutes * 60:.0f} s"
    if minutes < 120:
        return f"{minutes:.1f} min"
    return f"{minutes / 60:.1f} h"


def drainer_env(database_url: str) -> dict[str, str]:
    env = bench_env(database_url)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # a worker's counters: in-process
    return env


def bench_drain(
    args: argparse.Namespace, server: GunicornServer, database_url: str
) -> dict[str, Any]:
    """The drain section on a running server; prints and writes its figures."""
    print(
        f"\ndrain: {args.drain_rounds} rounds of a {args.backlog}-event backlog drained by "
        f"W = {', '.join(map(str, args.workers))} processes, beside the full path's new events",
        flush=True,
    )
    rounds = drain_rounds(args, server, database_url)
    result = summary(rounds)
    if args.celery:
        print(f"  through the Celery task, once ({args.backlog} events) ...", flush=True)
        try:
            result["celery"] = celery_drain(database_url, args.backlog)
        except Exception as exc:  # no Redis here: the rest stands
            result["celery"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    result["projection"] = projection(result)
    config = {
        "commit": git_commit(),
        "backlog": args.backlog,
        "rounds": args.drain_rounds,
        "workers": args.workers,
        "gunicorn_workers": 2,
        "cpu_count": os.cpu_count(),
        "receive_errors": rounds["receive_errors"],
    }
    print()
    print(render(result, config))
    write_section(args.drain_output, config, result)
    return result


def failed(result: dict[str, Any]) -> bool:
    """Whether a drain applied anything other than every event once."""
    problems = [p for d in result["drains"].values() for p in d["problems"]]
    return bool(problems or result.get("celery", {}).get("problems"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backlog", type=int, default=2000, help="due failed events a drain")
    parser.add_argument("--drain-rounds", dest="drain_rounds", type=int, default=5)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="drainer processes (W) to measure"
    )
    parser.add_argument(
        "--no-celery", dest="celery", action="store_false", help="skip the real worker's run"
    )
    parser.add_argument("--drain-output", type=Path, default=RESULTS_DIR / "drain.json")


def run(args: argparse.Namespace) -> int:
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    env = database_prepare(database_url)
    with GunicornServer(env, RESULTS_DIR / "gunicorn.log") as server:
        print(f"serving on {server.host}:{server.port} with gunicorn, 2 sync workers", flush=True)
        rps, errors = receive_phase(server, event_bodies(WARMUP_EVENTS, "warmup"), "warmup")
        database_analyze(database_url)
        result = bench_drain(args, server, database_url)
    return 1 if failed(result) or errors else 0


if __name__ == "__main__":
    bench_main(
        "tests.bench.drain",
        __doc__,
        add_arguments,
        run,
        stopped="the server and the drainers were stopped",
    )
