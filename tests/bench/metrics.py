"""Benchmark of a /metrics/ scrape, webhook_status and the overview against 1,000,000
receipts, 100,000 failed events and 1,000,000 outbox messages (a command, not a timed
test).

    python -m tests.bench.metrics [--receipts N] [--failed N] [--outbox N] [--scrapes N]

It recreates a ``webhook_receiver_bench_metrics`` database on the local PostgreSQL
(BENCH_METRICS_DATABASE_URL to change it), fills it with one INSERT … SELECT
generate_series per table: receipts over 30 days from four sources; failed events, most
of them resolved or discarded as in a long-running system, some dead and some retrying
(a few overdue); silence alerts and repair items, most of them resolved; outbox messages
to three destinations, most delivered, 20,000 open (tests/bench/status.py). Then VACUUM
ANALYZE, as autovacuum would have done by then (index-only scans need its visibility
map), and it times GET /metrics/ through Django's full request path: the token, every
database read, the counters and the text. It prints the median scrape against a floor
measured in the same run (the same number of ``SELECT 1`` round trips, one after the
other: what the statements would cost if the database did no work), against the same
scrape on the empty tables before the fill (so the ratio is what the tables' size
adds), and each statement's plan nodes, which must all be index scans. Target: under
100 ms a scrape; it exits 1 if a scrape is slower or a plan reads a table sequentially.
Then ``webhook_status --json`` and the admin's overview, each against its own floor of
round trips, with its slowest statements (targets: webhook_status under 1 s, a third of
its 3 s bound STATUS_TIMEOUT_SECONDS; the overview, which adds the traffic chart and
the gaps between receipts, under those 3 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from .cli import bench_main
from .server import database_recreate
from .status import outbox_fill, status_bench

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_metrics"
SOURCES = ("shop", "stripe", "github", "partner")
TOKEN = "bench-metrics-token"
TARGET_MS = 100.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--failed", type=int, default=100_000)
    parser.add_argument("--outbox", type=int, default=1_000_000, help="outbox messages")
    parser.add_argument("--scrapes", type=int, default=20, help="timed scrapes (median)")


def run(args: argparse.Namespace) -> int:
    url = os.environ.get("BENCH_METRICS_DATABASE_URL", DEFAULT_URL)
    database_recreate(url)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ.setdefault("SHOP_WEBHOOK_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    # this process's counters: the single-process registry
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    import warnings

    import django

    # whitenoise's, about static files this bench never serves
    warnings.filterwarnings("ignore", message="No directory at")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from webhook_receiver.conf import app_settings

    call_command("migrate", verbosity=0)
    shop = settings.WEBHOOK_RECEIVER["SOURCES"]["shop"]
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "SOURCES": {slug: {**shop, "RECONCILE": None} for slug in SOURCES},
        "METRICS_TOKEN": TOKEN,
    }
    settings.ALLOWED_HOSTS = ["testserver"]
    app_settings.cache_clear()

    from django.test import Client

    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    # the same scrape on empty tables: what the sizes below add to it
    for _ in range(3):
        _scrape(client, auth)
    empty_ms = statistics.median(_timed(lambda: _scrape(client, auth)) for _ in range(args.scrapes))
    empty_ms *= 1000
    connection.close()  # no statement prepared on the empty tables is kept

    print(f"filling {args.receipts:,} receipts and {args.failed:,} failed events…", flush=True)
    started = time.monotonic()
    shares = _fill(connection, args.receipts, args.failed, args.outbox)
    print(f"  {time.monotonic() - started:.1f} s; failed events by status: {shares}", flush=True)

    statements = _statements_of_a_scrape(connection, client, auth)
    for _ in range(3):  # warm-up: connection, imports, plans
        _scrape(client, auth)
    # interleaved, so that both see whatever else the machine is doing at the time
    scrapes, floors = [], []
    for _ in range(args.scrapes):
        scrapes.append(_timed(lambda: _scrape(client, auth)))
        floors.append(_timed(lambda: _round_trips(connection, len(statements))))
    scrape_ms = statistics.median(scrapes) * 1000
    floor_ms = statistics.median(floors) * 1000
    plans = [_plan(connection, sql, params) for sql, params in statements]
    # The destinations and the sources kept as records are configuration, a handful of
    # rows, listed whole at each scrape: reading those tables is the point. Every other
    # table must be read through an index.
    configuration = ("webhookdestination", "webhooksource")
    sequential = [
        nodes
        for (sql, _), (_, nodes) in zip(statements, plans, strict=True)
        if any(n.startswith("Seq Scan") for n in nodes)
        and not any(f'FROM "webhook_receiver_{table}"' in sql for table in configuration)
    ]

    print()
    print(
        f"GET /metrics/ with {len(SOURCES)} sources, {args.receipts:,} receipts, "
        f"{args.failed:,} failed events, {args.outbox:,} outbox messages"
    )
    print(f"  scrape      {scrape_ms:7.2f} ms  median of {args.scrapes} (target < {TARGET_MS:.0f})")
    print(f"  slowest     {max(scrapes) * 1000:7.2f} ms")
    print(f"  floor       {floor_ms:7.2f} ms  ({len(statements)} SELECT 1 round trips)")
    print(f"  ratio       {scrape_ms / floor_ms:7.2f}     (scrape / floor)")
    print(f"  empty       {empty_ms:7.2f} ms  (the same scrape before the tables were filled)")
    print(f"  ratio       {scrape_ms / empty_ms:7.2f}     (scrape / empty: what the sizes add)")
    print(f"  statements  {len(statements):7d}     ({len(statements) / len(SOURCES):.1f} a source)")
    print("\nplans (EXPLAIN ANALYZE: the time in the database; node, index, rows)")
    for (sql, _), (ms, nodes) in zip(statements, plans, strict=True):
        print(f"  {ms:6.2f} ms  {_what(sql)}")
        for node in nodes:
            print(f"               {node}")
    if sequential:
        print(f"\n!!! {len(sequential)} statements read a table sequentially")
    statuses_within = status_bench(connection, args.scrapes, lambda n: _round_trips(connection, n))
    return 0 if scrape_ms < TARGET_MS and not sequential and statuses_within else 1


# failed events by status, per 100: a long-running system keeps resolved and discarded
# ones for FAILED_EVENT_RETENTION_DAYS, so most rows are not the ones a scrape counts
FAILED_MIX = (("resolved", 80), ("discarded", 10), ("dead", 6), ("retrying", 4))


def _fill(connection, receipts: int, failed: int, outbox: int) -> dict[str, int]:
    sources = "ARRAY[" + ", ".join(f"'{s}'" for s in SOURCES) + "]"
    source = f"({sources})[1 + n % {len(SOURCES)}]"
    with connection.cursor() as cursor:
        # receipts: over the last 30 days, the newest a few seconds ago
        cursor.execute(
            f"""
            INSERT INTO webhook_receiver_webhookreceipt (source, event_key, event_type,
                message_id, status, subject, outcome, body, headers, received_at)
            SELECT {source}, 'evt_' || n, 'inventory.reserved', 'evt_' || n, 'applied',
                'ord_' || (n % 50000), '{{}}'::jsonb, '\\x7b7d'::bytea, '{{}}'::jsonb,
                now() - (n * (interval '30 days' / {receipts}))
            FROM generate_series(1, {receipts}) AS n
            """
        )
        # failed events: statuses in FAILED_MIX by n % 100; retrying ones due from 30
        # minutes ago to 2 hours ahead
        cases, low = [], 0
        for status, share in FAILED_MIX:
            cases.append(f"WHEN n % 100 < {low + share} THEN '{status}'")
            low += share
        status = "CASE " + " ".join(cases) + " END"
        cursor.execute(
            f"""
            INSERT INTO webhook_receiver_failedevent (source, event_key, event_type,
                message_id, body, headers, status, attempts, errors, last_error_class,
                last_error_message, first_attempt_at, last_attempt_at, next_attempt_at,
                resolution, last_replayed_by, discarded_by, discard_reason, updated_at)
            SELECT source, key, 'inventory.reserved', key, '\\x7b7d'::bytea, '{{}}'::jsonb,
                status, 1, '[]'::jsonb, 'RuntimeError', 'bench', at, at,
                CASE WHEN status = 'retrying'
                    THEN now() - interval '30 minutes' + (n % 150) * interval '1 minute'
                END,
                '', '', '', '', at
            FROM (
                SELECT n, {source} AS source, 'failed_' || n AS key, {status} AS status,
                    now() - (n * (interval '30 days' / {failed})) AS at
                FROM generate_series(1, {failed}) AS n
            ) AS rows
            """
        )
        cursor.execute(
            """
            INSERT INTO webhook_receiver_reconciliationrun (source, window_start,
                window_end, started_at, finished_at, outcome, sender_records, counts, error)
            VALUES ('shop', now() - interval '2 hours', now() - interval '10 minutes',
                now(), now(), 'needs_repair', 0, '{}'::jsonb, '')
            RETURNING id
            """
        )
        run_id = cursor.fetchone()[0]
        # repair items: 20,000 resolved, 200 open, of every kind
        cursor.execute(
            f"""
            INSERT INTO webhook_receiver_repairitem (source, kind, event_key, subject,
                event_type, occurred_at, sender_says, we_hold, status, created_at,
                updated_at, resolved_by, resolution_note, history, first_run_id,
                last_run_id)
            SELECT {source},
                (ARRAY['missing', 'failed', 'unexpected', 'state_mismatch'])[1 + n / 7 % 4],
                'repair_' || n, '', '', now(), '{{}}'::jsonb, '{{}}'::jsonb,
                CASE WHEN n <= 200 THEN 'open' ELSE 'resolved' END, now(), now(), '', '',
                '[]'::jsonb, {run_id}, {run_id}
            FROM generate_series(1, 20200) AS n
            """
        )
        # silence alerts: 500 resolved incidents, one open (shop's)
        cursor.execute(
            f"""
            INSERT INTO webhook_receiver_silencealert (source, opened_at,
                silence_after_seconds, rejected_counts, rejected_total, last_checked_at,
                resolved_at)
            SELECT {source}, now() - n * interval '1 hour', 1200, '{{}}'::jsonb, 0, now(),
                CASE WHEN n > 0 THEN now() - n * interval '1 hour' + interval '30 minutes'
                END
            FROM generate_series(0, 500) AS n
            """
        )
        cursor.execute("SELECT status, count(*) FROM webhook_receiver_failedevent GROUP BY status")
        shares = dict(cursor.fetchall())
    print(f"  outbox messages by status: {outbox_fill(connection, outbox)}", flush=True)
    # outside a transaction: VACUUM cannot run in one
    tables = ("webhookreceipt", "failedevent", "repairitem", "silencealert")
    for table in (*tables, "webhookdestination", "outboxmessage"):
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE webhook_receiver_{table}")
    return shares


def _scrape(client, auth: dict[str, str]) -> None:
    response = client.get("/metrics/", **auth)
    assert response.status_code == 200, response.content[:200]


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _round_trips(connection, n: int) -> None:
    with connection.cursor() as cursor:
        for _ in range(n):
            cursor.execute("SELECT 1")
            cursor.fetchone()


def _statements_of_a_scrape(connection, client, auth) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def record(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        _scrape(client, auth)
    return seen


def _plan(connection, sql: str, params: Any) -> tuple[float, list[str]]:
    """The statement's execution time in the database (ms), and its plan's nodes."""
    import json

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    explained = (json.loads(document) if isinstance(document, str) else document)[0]
    return explained["Execution Time"], list(_nodes(explained["Plan"]))


def _nodes(plan: dict[str, Any]) -> Iterator[str]:
    text = plan["Node Type"]
    if "Index Name" in plan:
        text += f" using {plan['Index Name']}"
    if "Actual Rows" in plan:
        text += f" ({plan['Actual Rows']} rows"
        if plan.get("Heap Fetches"):
            text += f", {plan['Heap Fetches']} heap fetches"
        text += ")"
    yield text
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _what(sql: str) -> str:
    """A statement, short: its table and what follows WHERE."""
    flat = " ".join(sql.replace('"', "").split())
    table = flat.split(" FROM ", 1)[1].split(" ", 1)[0] if " FROM " in flat else ""
    where = flat.split(" WHERE ", 1)[1] if " WHERE " in flat else ""
    short = table.removeprefix("webhook_receiver_")
    return f"{short}: {where.replace(table + '.', '')}"[:100]


if __name__ == "__main__":
    bench_main("tests.bench.metrics", __doc__, add_arguments, run)
