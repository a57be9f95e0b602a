"""`make bench`: the receive path under gunicorn on PostgreSQL, against two floors.

    python -m tests.bench.run [--requests N] [--concurrency C] [--rounds R] [--pgbouncer]
                              [--no-drain] [--no-growth] [--rebuild] …


Recreates the bench database (BENCH_DATABASE_URL), migrates it, creates the claim
floor's tables, serves ``project.wsgi`` with gunicorn (2 sync workers), and loads three
endpoints in interleaved rounds: the bare DRF view, the minimal claim floor and the full
path, each with N new events and then the same N again as duplicates. Prints medians,
ratios and targets, and writes bench-results/receive.json. Exits 1 if any request got
an unexpected answer; figures below target are reported, not failed.

Then, on the same server, two sections of their own (each runnable alone):
``tests.bench.drain``, the retry sweeper draining a backlog of failed events beside the
full path's receive rate (bench-results/drain.json), and ``tests.bench.growth``, the full
path on a database of a million receipts against this one (bench-results/growth.json;
the large database is built once, a few minutes, and reused).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import environ

from tests.support.private_servers import running_pgbouncer

from . import drain, growth
from .cli import bench_main
from .common import BARE_PATH, CLAIM_PATH, DEFAULT_DATABASE_URL, FULL_PATH
from .load import PhaseResult, event_bodies, run_phase, signed_requests
from .report import (
    BARE,
    CLAIM,
    DUPLICATE,
    ENDPOINTS,
    FULL,
    NEW,
    PHASES,
    Rounds,
    render,
    stats_of,
    summary,
    write_json,
)
from .server import (
    RESULTS_DIR,
    GunicornServer,
    database_analyze,
    database_prepare,
    floor_tables_create,
    git_commit,
)

WARMUP_REQUESTS = 300


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    answers: dict[str, str]  # phase -> the "status" every answer must carry


ENDPOINT_SPECS = {
    BARE: Endpoint(BARE, BARE_PATH, {NEW: "ok", DUPLICATE: "ok"}),
    CLAIM: Endpoint(CLAIM, CLAIM_PATH, {NEW: "applied", DUPLICATE: "duplicate"}),
    FULL: Endpoint(FULL, FULL_PATH, {NEW: "applied", DUPLICATE: "duplicate"}),
}


class ErrorLog:
    """Every unexpected answer counted; a few kept to show what they were."""

    MAX_SAMPLES = 8

    def __init__(self) -> None:
        self.count = 0
        self.samples: list[str] = []

    def add(self, label: str, result: PhaseResult) -> None:
        self.count += result.errors
        room = self.MAX_SAMPLES - len(self.samples)
        self.samples.extend(f"{label}: {s}" for s in result.error_samples[: min(2, room)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Many short rounds rather than a few long ones: other work on a shared 2-core
    # machine comes in bursts of seconds, which a short round pairs up across endpoints
    # and a median of fifteen shrugs off. 1000 requests still give a p99 from 10
    # samples, and the whole run stays near three minutes.
    parser.add_argument("--requests", type=int, default=1000, help="requests per phase")
    # 4 clients keep both sync workers busy (two requests wait in the listen backlog
    # while two are served) without starving the server of CPU: measured here, 1-2
    # clients left the workers idle between requests, 4 and 6 gave the same
    # throughput, and 8 only lengthened the queue (higher latency, noisier figures).
    parser.add_argument("--concurrency", type=int, default=4, help="client processes")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "receive.json")
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="serve through PgBouncer in transaction mode (DATABASE_POOL_MODE=transaction), "
        "started on a port of its own",
    )
    parser.add_argument("--no-drain", dest="drain", action="store_false", help="skip the drain")
    parser.add_argument(
        "--no-growth", dest="growth", action="store_false", help="skip the growth section"
    )
    drain.add_arguments(parser)
    growth.add_arguments(parser)


def measure(
    server: GunicornServer,
    endpoint: Endpoint,
    phase: str,
    bodies: list[bytes],
    tag: str,
    concurrency: int,
) -> PhaseResult:
    """One endpoint's phase: new events, or the same events again (re-signed, same ids)."""
    requests = signed_requests(
        host=f"{server.host}:{server.port}",
        path=endpoint.path,
        bodies=bodies,
        msg_prefix=f"msg_{endpoint.name}_{tag}",  # distinct per endpoint: every "new" is new
        expected_status=endpoint.answers[phase],
    )
    return run_phase(server.host, server.port, requests, concurrency)


def bench(args: argparse.Namespace, server: GunicornServer, errors: ErrorLog) -> Rounds:
    # Warm-up: both workers import, connect and fill their caches; figures discarded.
    warmup = event_bodies(WARMUP_REQUESTS, "warmup")
    for phase in PHASES:
        for name in ENDPOINTS:
            result = measure(
                server, ENDPOINT_SPECS[name], phase, warmup, "warmup", args.concurrency
            )
            errors.add(f"warm-up {name} {phase}", result)
    database_analyze(server.env["BENCH_DATABASE_URL"])

    rounds: Rounds = {name: {phase: [] for phase in PHASES} for name in ENDPOINTS}
    for number in range(args.rounds):
        tag = f"r{number}"
        bodies = event_bodies(args.requests, tag)  # the same events for every endpoint
        shift = number % len(ENDPOINTS)  # rotate the order: no endpoint always goes first
        order = ENDPOINTS[shift:] + ENDPOINTS[:shift]
        # Phase by phase, so that the endpoints compared in a ratio run back to back,
        # seconds apart, and share whatever else the machine is doing then.
        for phase in PHASES:
            for name in order:
                result = measure(server, ENDPOINT_SPECS[name], phase, bodies, tag, args.concurrency)
                errors.add(f"round {number + 1} {name} {phase}", result)
                rounds[name][phase].append(stats_of(result))
                print(
                    f"  round {number + 1}/{args.rounds} {name:<12} {phase:<10} "
                    f"{rounds[name][phase][-1].rps:8.1f} req/s",
                    flush=True,
                )
    return rounds


def run(args: argparse.Namespace) -> int:
    if args.pgbouncer and (args.drain or args.growth):
        # their drainers and second server connect directly: not comparable to a server
        # behind the pooler
        print("--pgbouncer: the drain and growth sections are skipped")
        args.drain = args.growth = False
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    env = database_prepare(database_url)
    floor_tables_create(database_url)

    errors = ErrorLog()
    with contextlib.ExitStack() as stack:
        if args.pgbouncer:
            bouncer = stack.enter_context(running_pgbouncer())
            name = environ.Env.db_url_config(database_url)["NAME"]
            env["BENCH_SERVE_DATABASE_URL"] = bouncer.url(name)
            env["DATABASE_POOL_MODE"] = "transaction"
            print(f"through PgBouncer (transaction mode) on port {bouncer.port}", flush=True)
        server = GunicornServer(env, RESULTS_DIR / "gunicorn.log")
        print(f"serving on {server.host}:{server.port} with gunicorn, 2 sync workers", flush=True)
        with server:
            rounds = bench(args, server, errors)
            server_log = server.log_tail(lines=10) if errors.count else ""
            _report(args, rounds, errors, server_log)
            sections_failed = False
            if args.drain:
                drained = drain.bench_drain(args, server, database_url)
                sections_failed |= drain.failed(drained)
            if args.growth:
                grown = growth.bench_growth(args, server, database_url)
                sections_failed |= growth.failed(grown)
    return 1 if errors.count or sections_failed else 0


def _report(args: argparse.Namespace, rounds: Rounds, errors: ErrorLog, server_log: str) -> None:
    """The receive rounds' figures, printed and written."""

    config = {
        "commit": git_commit(),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "warmup_requests": WARMUP_REQUESTS,
        "gunicorn_workers": 2,
        "cpu_count": os.cpu_count(),
        "pgbouncer": args.pgbouncer,
    }
    result = summary(rounds)
    print()
    if errors.count:
        print(f"!!! {errors.count} REQUEST ERRORS: these figures are NOT valid (details below)\n")
    print(render(result, config))
    write_json(
        args.output,
        config=config,
        rounds=rounds,
        result=result,
        errors=errors.count,
        error_samples=errors.samples,
    )
    print(f"\nwrote {args.output}")
    if errors.count:
        _report_errors(errors, server_log)


def _report_errors(errors: ErrorLog, server_log: str) -> None:
    banner = "!" * 72
    print(f"\n{banner}\nREQUEST ERRORS: {errors.count} requests did not get the expected answer;")
    print("the figures above are NOT valid.", *errors.samples, sep="\n  ", file=sys.stdout)
    if server_log:
        print("gunicorn log (tail):", server_log, sep="\n")
    print(banner)


if __name__ == "__main__":
    bench_main(
        "tests.bench.run",
        __doc__,
        add_arguments,
        run,
        at_least_one=("requests", "concurrency", "rounds"),
        stopped="the server was stopped",
    )
