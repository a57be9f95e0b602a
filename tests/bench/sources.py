"""A source kept as a record against one of the settings: requests a second to each.

    python -m tests.bench.sources [--requests N] [--concurrency C] [--rounds R]

Recreates its own bench database (BENCH_DATABASE_URL, default
``webhook_receiver_bench_sources``), adds the record source ``acme`` with
``manage.py webhook_source`` (the settings' ``shop`` secret, so the same signer serves
both), serves ``project.wsgi`` with gunicorn (2 sync workers), and loads the two sources
in interleaved rounds of N new events each (the same events, under each slug). The
settings source is the floor, measured in the same run: a record source's request reads
the records at most once per SOURCE_RECORDS_TTL_SECONDS per process, and otherwise does
the same work. A third phase sends N requests to N made-up slugs (404), which the
records' snapshot answers too. Prints the medians, the ratio record / settings (the
median of each round's ratio of its two back-to-back phases) against its target, and
exits 1 if any request got an unexpected answer (a figure below its target is reported,
not failed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from .cli import bench_main
from .common import SHOP_SECRET, SOURCE
from .load import (
    PhaseResult,
    event_bodies,
    run_phase,
    signed_requests,
    unknown_slugs,
)
from .report import percentile
from .server import (
    BASE_DIR,
    RESULTS_DIR,
    GunicornServer,
    database_analyze,
    database_prepare,
    git_commit,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_sources"
RECORD = "acme"
UNKNOWN_BODY = b'{"type": "inventory.reserved"}'
WARMUP_REQUESTS = 200
# a record source does the settings source's work, plus a dictionary lookup and, once a
# TTL per worker, one query: within measurement noise of the floor
TARGET_RATIO = 0.95


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=4, help="client processes")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")


def record_add(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "webhook_source", "add", RECORD, "--secret", SHOP_SECRET],
        cwd=BASE_DIR,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run(args: argparse.Namespace) -> int:
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    env = database_prepare(database_url)
    record_add(env)

    rates: dict[str, list[float]] = {SOURCE: [], RECORD: [], "unknown": []}
    p50: dict[str, list[float]] = {name: [] for name in rates}
    errors = 0
    server = GunicornServer(env, RESULTS_DIR / "gunicorn-sources.log")
    with server:
        host = f"{server.host}:{server.port}"
        for slug in (SOURCE, RECORD):  # both workers import, connect, read the records
            warmup = signed_requests(
                host=host,
                path=f"/webhooks/{slug}/",
                bodies=event_bodies(WARMUP_REQUESTS, f"warm-{slug}"),
                msg_prefix=f"warm-{slug}",
                expected_status="applied",
            )
            errors += run_phase(server.host, server.port, warmup, args.concurrency).errors
        database_analyze(database_url)
        for number in range(args.rounds):
            bodies = event_bodies(args.requests, f"r{number}")
            # alternate which goes first, so neither always meets the warmer database
            order = (SOURCE, RECORD) if number % 2 == 0 else (RECORD, SOURCE)
            for slug in order:
                requests = signed_requests(
                    host=host,
                    path=f"/webhooks/{slug}/",
                    bodies=bodies,
                    msg_prefix=f"r{number}-{slug}",
                    expected_status="applied",
                )
                result = run_phase(server.host, server.port, requests, args.concurrency)
                errors += _account(slug, result, rates, p50, number, args.rounds)
            result = run_phase(
                server.host,
                server.port,
                unknown_slugs(host, args.requests, UNKNOWN_BODY),
                args.concurrency,
            )
            errors += _account("unknown", result, rates, p50, number, args.rounds)

    # each round's two phases run back to back: their ratio is paired, so load from
    # outside the bench that drifts between rounds cancels out of it; the median of
    # those is the figure
    paired = [r / f for r, f in zip(rates[RECORD], rates[SOURCE], strict=True) if f]
    ratio = statistics.median(paired) if paired else 0.0
    verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
    print(
        f"\ncommit {git_commit()}, {args.concurrency} clients, {args.rounds} rounds of "
        f"{args.requests}, gunicorn with 2 sync workers\n"
    )
    print("| source | req/s (median) | p50 ms (median) |")
    print("|---|---|---|")
    for label, name in (
        ("settings (shop)", SOURCE),
        ("record (acme)", RECORD),
        ("made-up slugs (404)", "unknown"),
    ):
        print(
            f"| {label} | {statistics.median(rates[name]):.0f} "
            f"| {statistics.median(p50[name]):.1f} |"
        )
    rounds = ", ".join(f"{r:.2f}" for r in paired)
    print(
        f"\nrecord / settings, median of the rounds' ratios: {ratio:.2f} ({verdict} the "
        f"target {TARGET_RATIO}); by round: {rounds}"
    )
    if errors:
        print(f"\n!!! {errors} unexpected answers: these figures are NOT valid", file=sys.stderr)
        return 1
    return 0


def _account(
    name: str,
    result: PhaseResult,
    rates: dict[str, list[float]],
    p50: dict[str, list[float]],
    number: int,
    rounds: int,
) -> int:
    """Keep one phase's figures, print its line; return its unexpected answers."""
    for sample in result.error_samples:
        print(f"  {name}: {sample}", file=sys.stderr)
    rates[name].append(result.requests / result.elapsed_s if result.elapsed_s else 0.0)
    p50[name].append(percentile(result.latencies_ms, 0.5))
    print(f"  round {number + 1}/{rounds} {name:<8} {rates[name][-1]:7.0f} req/s", flush=True)
    return result.errors


if __name__ == "__main__":
    bench_main(
        "tests.bench.sources",
        __doc__,
        add_arguments,
        run,
        at_least_one=("requests", "concurrency", "rounds"),
        stopped="the server was stopped",
    )
