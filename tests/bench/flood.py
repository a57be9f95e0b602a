"""A flood of refused requests: what it writes to the database, and what each costs.

    python -m tests.bench.flood [--requests N] [--concurrency C]

Recreates its own bench database (BENCH_DATABASE_URL, default
``webhook_receiver_bench_flood``), serves ``project.wsgi`` with gunicorn (2 sync
workers), and sends three floods of N requests each, as one client would: unsigned
POSTs to a configured source (400), POSTs with a forged signature (401), and POSTs to N
random slugs (404). For each it prints the rows and bytes (heap, indexes and TOAST) that
the audit records and the rejection tallies gained, and the requests' throughput and
latency. Each flood has a reason of its own, so each starts its tally afresh; one that
spans a minute's end starts a second. Bytes include the dead row versions of the
tallies' updates until VACUUM (or a page's pruning) reclaims them. Exits 1 if any
request got an unexpected answer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from .cli import bench_main
from .common import SOURCE
from .load import PreparedRequest, http_request, run_phase, standard_headers, unknown_slugs
from .report import percentile
from .server import (
    RESULTS_DIR,
    GunicornServer,
    _connect,
    database_analyze,
    database_prepare,
    git_commit,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_flood"
TABLES = ("webhook_receiver_requestaudit", "webhook_receiver_rejectiontally")
BODY = b'{"type": "inventory.reserved", "data": {"order_id": "ord_flood", "version": 1}}'
WARMUP_REQUESTS = 200


@dataclass(frozen=True)
class Footprint:
    rows: int
    bytes: int


def footprint(database_url: str) -> dict[str, Footprint]:
    """Rows and total bytes of each table (a table not there yet: zero)."""
    sizes = {}
    with _connect(database_url) as conn:
        for table in TABLES:
            if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
                sizes[table] = Footprint(0, 0)
                continue
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            size = conn.execute("SELECT pg_total_relation_size(%s)", [table]).fetchone()[0]
            sizes[table] = Footprint(rows, size)
    return sizes


def flood(kind: str, host: str, count: int) -> list[PreparedRequest]:
    """``count`` requests of one kind, each with the answer it must get."""
    path = f"/webhooks/{SOURCE}/"
    if kind == "unsigned":
        wire = http_request(host, path, BODY, {"Content-Type": "application/json"})
        return [PreparedRequest(path, wire, "missing_signature_headers", b"400")] * count
    if kind == "malformed":  # the warm-up's: a reason of its own, so it fills no flood's tally
        headers = {"webhook-id": "m", "webhook-timestamp": "x", "webhook-signature": "v1,A"}
        wire = http_request(host, path, BODY, headers)
        return [PreparedRequest(path, wire, "malformed_signature_headers", b"400")] * count
    if kind == "forged":
        headers = standard_headers("msg_forged", BODY, int(time.time()))
        headers["webhook-signature"] = "v1," + "A" * 43 + "="
        wire = http_request(host, path, BODY, headers)
        return [PreparedRequest(path, wire, "invalid_signature", b"401")] * count
    return unknown_slugs(host, count, BODY)


KINDS = ("unsigned", "forged", "random slugs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=10_000, help="requests per flood")
    parser.add_argument("--concurrency", type=int, default=4, help="client processes")


def run(args: argparse.Namespace) -> int:
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    env = database_prepare(database_url)

    errors = 0
    lines = []
    server = GunicornServer(env, RESULTS_DIR / "gunicorn-flood.log")
    with server:
        host = f"{server.host}:{server.port}"
        # both workers import, connect and fill their caches
        warmup = flood("malformed", host, WARMUP_REQUESTS)
        errors += run_phase(server.host, server.port, warmup, args.concurrency).errors
        database_analyze(database_url)
        for kind in KINDS:
            requests = flood(kind, host, args.requests)
            before = footprint(database_url)
            result = run_phase(server.host, server.port, requests, args.concurrency)
            after = footprint(database_url)
            errors += result.errors
            for sample in result.error_samples:
                print(f"  {kind}: {sample}", file=sys.stderr)
            grown = {
                t: Footprint(after[t].rows - before[t].rows, after[t].bytes - before[t].bytes)
                for t in TABLES
            }
            rows = sum(g.rows for g in grown.values())
            size = sum(g.bytes for g in grown.values())
            lines.append(
                f"| {kind} | {result.requests} | {grown[TABLES[0]].rows} | {grown[TABLES[1]].rows} "
                f"| {size / 1024:.0f} KiB | {rows * 10_000 / result.requests:.0f} rows, "
                f"{size * 10_000 / result.requests / 1024:.0f} KiB "
                f"| {result.requests / result.elapsed_s:.0f} "
                f"| {percentile(result.latencies_ms, 0.5):.1f} / "
                f"{percentile(result.latencies_ms, 0.99):.1f} |"
            )
            print(lines[-1], flush=True)
    print(f"\ncommit {git_commit()}, {args.concurrency} clients, gunicorn with 2 sync workers\n")
    print(
        "| flood | requests | audit rows | tally rows | bytes written | per 10,000 "
        "| req/s | p50 / p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    if errors:
        print(f"\n!!! {errors} unexpected answers: these figures are NOT valid", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    bench_main(
        "tests.bench.flood",
        __doc__,
        add_arguments,
        run,
        at_least_one=("requests", "concurrency"),
        stopped="the server was stopped",
    )
