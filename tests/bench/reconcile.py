"""Benchmark of reconciliation: a window of 100,000 sender events against 1,000,000
receipts (make bench-reconcile; a command, not a timed test).

    python -m tests.bench.reconcile [--receipts N] [--events N] [--missing N]

It recreates a ``webhook_receiver_bench_reconcile`` database on the local PostgreSQL
(BENCH_RECONCILE_DATABASE_URL to change it), fills it with receipts spread over 24
hours, and reconciles the last hour, whose sender list (generated page by page, 1000 a
page, as an adapter would receive them) holds every receipt of that hour but
``--missing`` events we never received. It prints the run's time, the process's peak
memory and the number of statements, against a floor measured in the same run: one
query that reads the window's receipt keys and a pass over the same sender pages, the
least any comparison must do. Targets: under 60 s, under 300 MB, statements that grow
with pages, not with events.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from datetime import datetime, timedelta

from .cli import bench_main
from .server import database_recreate

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/webhook_receiver_bench_reconcile"
PAGE = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=100_000, help="sender events in the window")
    parser.add_argument("--missing", type=int, default=100)


def run(args: argparse.Namespace) -> int:
    url = os.environ.get("BENCH_RECONCILE_DATABASE_URL", DEFAULT_URL)
    database_recreate(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("SHOP_WEBHOOK_SECRETS", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    now = datetime.now().astimezone()
    window_end = now - timedelta(minutes=10)
    window_start = window_end - timedelta(hours=1)
    in_window = args.events - args.missing
    print(f"filling {args.receipts:,} receipts ({in_window:,} in the window)…", flush=True)
    started = time.monotonic()
    _fill(connection, args.receipts, in_window, window_start, window_end)
    print(f"  {time.monotonic() - started:.1f} s", flush=True)

    def sender_pages(*, options, since, until):
        """The sender's list: every receipt key of the window, and the missing ones."""
        step = (window_end - window_start) / args.events
        for first in range(0, args.events, PAGE):
            page = []
            for n in range(first, min(first + PAGE, args.events)):
                key = f"evt_{n}" if n < in_window else f"lost_{n}"
                page.append(_event(key, window_start + step * n))
            yield page

    from webhook_receiver.reconcile.adapters import get_adapter

    get_adapter.cache_clear()
    sys.modules[__name__].sender_pages = sender_pages  # the adapter, by dotted path

    floor = _floor(connection, sender_pages, window_start, window_end)
    statements, seconds, run = _reconcile(connection, window_start, window_end, now)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pages = -(-args.events // PAGE)
    print()
    print(f"reconciliation of {args.events:,} sender events against {args.receipts:,} receipts")
    print(f"  outcome {run.outcome}, counts {run.counts}")
    print(f"  time        {seconds:6.1f} s   (target < 60 s)")
    print(f"  peak memory {peak_mb:6.0f} MB  (target < 300 MB; the whole process)")
    print(f"  statements  {statements:6d}     ({statements / pages:.1f} per page of {PAGE})")
    print(f"  floor       {floor:6.1f} s   (one query for the window's keys, one pass)")
    print(f"  ratio       {seconds / floor:6.1f}     (reconciliation / floor time)")
    ok = run.counts.get("missing") == args.missing and seconds < 60 and peak_mb < 300
    return 0 if ok else 1


def _event(key: str, created_at: datetime):
    from webhook_receiver.reconcile.adapters import SenderEvent

    return SenderEvent(id=key, type="inventory.reserved", created_at=created_at, data={})


def _fill(connection, total: int, in_window: int, start: datetime, end: datetime) -> None:
    """Receipts evt_0 … evt_{in_window-1} inside the window, the rest in the 23 hours
    before it: one INSERT … SELECT generate_series each."""
    with connection.cursor() as cursor:
        insert = """
            INSERT INTO webhook_receiver_webhookreceipt (source, event_key, event_type,
                message_id, status, subject, outcome, body, headers, received_at)
            SELECT 'shop', %s || n, 'inventory.reserved', %s || n, 'applied', '',
                '{}'::jsonb, '\\x7b7d'::bytea, '{}'::jsonb,
                %s::timestamptz + (n * %s::interval)
            FROM generate_series(0, %s) AS n
        """
        step = (end - start) / max(in_window, 1)
        cursor.execute(insert, ["evt_", "evt_", start, step, in_window - 1])
        before = total - in_window
        # ending a minute before the window: per-row steps are rounded to microseconds
        step_before = (timedelta(hours=23) - timedelta(minutes=1)) / max(before, 1)
        cursor.execute(
            insert, ["old_", "old_", start - timedelta(hours=23), step_before, before - 1]
        )
        cursor.execute("ANALYZE webhook_receiver_webhookreceipt")


def _count_statements(connection):
    counter = {"n": 0}

    def count(execute, sql, params, many, context):
        counter["n"] += 1
        return execute(sql, params, many, context)

    return counter, connection.execute_wrapper(count)


def _floor(connection, pages, start: datetime, end: datetime) -> float:
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT event_key FROM webhook_receiver_webhookreceipt "
            "WHERE source = 'shop' AND received_at >= %s AND received_at < %s",
            [start, end],
        )
        ours = {row[0] for row in cursor.fetchall()}
    listed = {event.id for page in pages(options={}, since=start, until=end) for event in page}
    assert listed - ours  # the missing ones
    return time.monotonic() - started


def _reconcile(connection, start: datetime, end: datetime, now: datetime):
    from django.conf import settings

    from webhook_receiver.reconcile.run import reconciliation_run

    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "SOURCES": {
            "shop": {
                **settings.WEBHOOK_RECEIVER["SOURCES"]["shop"],
                "RECONCILE": {"ADAPTER": f"{__name__}.sender_pages"},
            }
        },
        "STATE_COMPARISON": None,
    }
    from webhook_receiver.conf import app_settings

    app_settings.cache_clear()
    counter, wrapper = _count_statements(connection)
    started = time.monotonic()
    with wrapper:
        run = reconciliation_run(source_slug="shop", now=now, since=start, until=end)
    return counter["n"], time.monotonic() - started, run


if __name__ == "__main__":
    bench_main("tests.bench.reconcile", __doc__, add_arguments, run)
