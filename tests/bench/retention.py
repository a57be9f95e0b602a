"""`make bench-retention`: the purge jobs on tables of a million rows, and what a claim
feels while they run.

    python -m tests.bench.retention [--rows N] [--past FRACTION] [--seconds S]

Recreates a bench database of its own (RETENTION_DATABASE_URL), fills the receipts, the
audit records and the outbox (delivered messages with one attempt each) with N rows
each spread over the last 30 days plus the part past retention (``--past``, a quarter by
default: about an hour of the peak's 4,200 requests a minute at a million rows per
table is 250,000 rows, the hourly purge's work), and for each purge job:

- a baseline: for S seconds, one process receives new events in a closed loop
  (``webhook_receive``: verify, claim, apply, audit) and times each;
- the job, timed and its statements counted, while the same process receives again.

Prints each job's time, statements and rows a second, the claim's p50, p99 and max
without and during the job (their ratio is the figure; this machine is noisy), and the
table and index sizes per million rows. Writes bench-results/retention.json.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cli import bench_main
from .common import DEFAULT_DATABASE_URL, SOURCE
from .load import event_bodies, standard_headers
from .server import RESULTS_DIR, _connect, bench_env, database_migrate, database_recreate

DATABASE_URL = os.environ.get(
    "RETENTION_DATABASE_URL", DEFAULT_DATABASE_URL.rsplit("/", 1)[0] + "/webhook_retention_bench"
)
RESULTS = RESULTS_DIR / "retention.json"
DAY = 86400

# Each table's rows: the first ``past`` of them older than every retention (40 days),
# the rest spread over the last 30 days. $1: rows, $2: rows past retention.
FILL = {
    "webhook_receiver_webhookreceipt": """
        INSERT INTO webhook_receiver_webhookreceipt (source, event_key, event_type,
            message_id, signature_timestamp, body, headers, status, subject, outcome,
            received_at)
        SELECT 'shop', 'msg_fill_' || i, 'inventory.reserved', 'msg_fill_' || i, NULL,
            convert_to('{"type":"inventory.reserved","timestamp":1790000000,"data":'
                || '{"order_id":"ord-' || i || '","version":1,"lines":[{"sku":"sku-'
                || i %% 97 || '","quantity":1},{"sku":"sku-' || (i + 1) %% 97
                || '","quantity":2}]}}', 'UTF8'),
            ('{"content-type": "application/json", "webhook-id": "msg_fill", '
                || '"webhook-signature": "[redacted]", "webhook-timestamp": "1790000000"}'
            )::jsonb,
            'applied', 'ord-' || i,
            jsonb_build_object('status', 'applied', 'event_key', 'msg_fill_' || i),
            CASE WHEN i <= %(past)s THEN now() - interval '40 days' + i * interval '1 ms'
                 ELSE now() - (30.0 * 86400 * (%(rows)s - i) / %(rows)s) * interval '1 s' END
        FROM generate_series(1, %(rows)s) AS i
    """,
    "webhook_receiver_requestaudit": """
        INSERT INTO webhook_receiver_requestaudit (source, message_id, event_key,
            signature_timestamp, verification, result, response_status, body_sha256,
            body_size, remote_addr, received_at)
        SELECT 'shop', 'msg_fill_' || i, 'msg_fill_' || i, now(), 'verified', 'applied',
            200, md5(i::text) || md5((i + 1)::text), 180, '127.0.0.1',
            CASE WHEN i <= %(past)s THEN now() - interval '40 days' + i * interval '1 ms'
                 ELSE now() - (30.0 * 86400 * (%(rows)s - i) / %(rows)s) * interval '1 s' END
        FROM generate_series(1, %(rows)s) AS i
    """,
    "webhook_receiver_outboxmessage": """
        WITH destination AS (
            INSERT INTO webhook_receiver_webhookdestination (name, url, secrets,
                event_types, rate_count, rate_seconds, burst, max_in_flight,
                timeout_seconds, max_attempts, backoff_base_seconds, backoff_cap_seconds,
                retry_after_cap_seconds, breaker_threshold, breaker_cooldown_seconds,
                enabled, replay_horizon_days, tokens, consecutive_failures, record_error,
                created_at, updated_at)
            VALUES ('merchant', 'http://127.0.0.1:9/', '[]', '[]', 10, 1, 10, 4, 10, 12,
                2, 600, 600, 5, 60, true, 7, 10, 0, '', now(), now())
            RETURNING id
        ), messages AS (
            INSERT INTO webhook_receiver_outboxmessage (destination_id, key, event_type,
                payload, metadata, ordering_key, status, attempts, failures,
                next_attempt_at, origin_source, origin_event_key, created_at,
                delivered_at, last_status_code, last_error, discarded_by, discard_reason)
            SELECT destination.id, 'msg_fill_' || i, 'order.paid',
                jsonb_build_object('type', 'order.paid', 'order_id', 'ord-' || i),
                '{}', 'ord-' || i, 'delivered', 1, 0, t, 'shop', 'msg_fill_' || i, t, t,
                200, '', '', ''
            FROM destination, generate_series(1, %(rows)s) AS i,
                LATERAL (SELECT CASE WHEN i <= %(past)s
                    THEN now() - interval '40 days' + i * interval '1 ms'
                    ELSE now() - (30.0 * 86400 * (%(rows)s - i) / %(rows)s) * interval '1 s'
                    END AS t) AS at
            RETURNING id, created_at
        )
        INSERT INTO webhook_receiver_deliveryattempt (message_id, number, started_at,
            duration_ms, status_code, error, response_excerpt)
        SELECT id, 1, created_at, 12, 200, '', 'ok' FROM messages
    """,
}


def fill(rows: int, past: int) -> None:
    with _connect(DATABASE_URL) as conn:
        for table, statement in FILL.items():
            started = time.perf_counter()
            conn.execute(statement, {"rows": rows, "past": past})
            conn.execute(f"VACUUM ANALYZE {table}")
            print(f"  {table}: {rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        conn.execute("VACUUM ANALYZE webhook_receiver_deliveryattempt")


def sizes(rows: int) -> dict[str, dict[str, float]]:
    """Table (with TOAST) and index sizes per million rows, in MB, before any purge."""
    found = {}
    with _connect(DATABASE_URL) as conn:
        for table in (*FILL, "webhook_receiver_deliveryattempt"):
            table_bytes, index_bytes = conn.execute(
                "SELECT pg_table_size(%s), pg_indexes_size(%s)", (table, table)
            ).fetchone()
            scale = 1_000_000 / rows / 2**20
            found[table] = {"table_mb": table_bytes * scale, "indexes_mb": index_bytes * scale}
    return found


# --- the claim's side: one process receiving new events in a closed loop --------------


def _receive_loop(stop_at: float, ready: Any, stop: Any, tag: str, out: Any) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.bench.settings")
    import django

    django.setup()
    from django.db import connection

    from webhook_receiver.inbound.receive import webhook_receive

    bodies = event_bodies(20_000, tag)
    connection.ensure_connection()
    ready.set()  # the start-up stays outside the measured window
    latencies = []
    for number, body in enumerate(bodies):
        if time.monotonic() > stop_at or stop.is_set():
            break
        headers = standard_headers(f"msg_{tag}_{number}", body, int(time.time()))
        started = time.perf_counter()
        outcome = webhook_receive(
            source_slug=SOURCE, stream=io.BytesIO(body), content_length=len(body), headers=headers
        )
        latencies.append((time.perf_counter() - started) * 1000)
        assert outcome.status == "applied", outcome
    out.put(latencies)


def claims_during(work: Callable[[], Any], seconds: float, tag: str) -> tuple[list[float], Any]:
    """Receive for ``seconds`` (or until ``work`` is done, if it takes longer) while
    ``work`` runs in this process; return the latencies and what ``work`` returned."""
    context = mp.get_context("spawn")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    process = context.Process(
        target=_receive_loop, args=(time.monotonic() + 600, ready, stop, tag, out), daemon=True
    )
    process.start()
    child_ready(process, ready)
    result = work()
    if seconds:
        time.sleep(seconds)
    stop.set()
    latencies = out.get(timeout=120)
    process.join(timeout=30)
    return latencies, result


def child_ready(process: Any, ready: Any, timeout: float = 120.0) -> None:
    """Wait until the receiving process has started Django and connected."""
    deadline = time.monotonic() + timeout
    while not ready.wait(0.2):
        if not process.is_alive():
            raise RuntimeError(f"the receiving process exited at start (code {process.exitcode})")
        if time.monotonic() > deadline:
            process.terminate()
            raise RuntimeError(f"the receiving process was not ready within {timeout:.0f} s")


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    """The claims' figures; None for each when there were none (a job on a tiny table
    can end before the first claim does)."""
    ordered = sorted(latencies)
    if not ordered:
        return {"claims": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "claims": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[int(len(ordered) * 0.99)],
        "max_ms": ordered[-1],
    }


def timed_job(job: Callable[[], int]) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            deleted = job()
            took = time.perf_counter() - started
        return {"deleted": deleted, "seconds": took, "statements": len(queries)}

    return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    parser.add_argument("--past", type=float, default=0.25, help="share past retention")
    parser.add_argument("--seconds", type=float, default=10.0, help="baseline length")
    parser.add_argument("--output", type=Path, default=RESULTS)


def run(args: argparse.Namespace) -> int:
    past = int(args.rows * args.past)
    env = bench_env(DATABASE_URL)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("BENCH_", "DJANGO_"))})
    print(f"preparing {DATABASE_URL.rsplit('/', 1)[1]}: {args.rows:,} rows a table ...")
    database_recreate(DATABASE_URL)
    database_migrate(env)
    fill(args.rows, past)
    measured_sizes = sizes(args.rows)

    import django

    django.setup()
    from webhook_receiver.inbound.audit import purge_audit_records
    from webhook_receiver.inbound.retention import purge_receipts
    from webhook_receiver.outbound.retention import purge_outbox

    jobs = {"receipts": purge_receipts, "audit": purge_audit_records, "outbox": purge_outbox}
    results: dict[str, Any] = {}
    for name, job in jobs.items():
        print(f"{name}: baseline ...", flush=True)
        quiet, _ = claims_during(lambda: None, args.seconds, f"{name}-base")
        print(f"{name}: purging ...", flush=True)
        during, figures = claims_during(timed_job(job), 0, f"{name}-purge")
        results[name] = {"job": figures, "quiet": percentiles(quiet), "during": percentiles(during)}
    report(results, measured_sizes, args, past)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"rows": args.rows, "past": past, "sizes": measured_sizes, **results}, indent=2)
    )
    print(f"\nwrote {args.output}")
    return 0


def report(results: dict[str, Any], sizes: dict[str, Any], args: argparse.Namespace, past: int):
    print(f"\nPurge jobs on {args.rows:,} rows a table, {past:,} of them past retention")
    print(f"{'job':<10}{'deleted':>10}{'seconds':>9}{'statements':>12}{'rows/s':>9}"
          f"{'claim p50 quiet/during':>25}{'p99 quiet/during':>20}{'max during':>12}")  # fmt: skip
    for name, figures in results.items():
        job, quiet, during = figures["job"], figures["quiet"], figures["during"]
        rate = job["deleted"] / job["seconds"] if job["seconds"] else 0.0
        ratio = (
            f"   (p99 x{during['p99_ms'] / quiet['p99_ms']:.2f})"
            if quiet["p99_ms"] and during["p99_ms"] is not None
            else f"   ({quiet['claims']} / {during['claims']} claims)"
        )
        print(
            f"{name:<10}{job['deleted']:>10,}{job['seconds']:>9.1f}{job['statements']:>12,}"
            f"{rate:>9,.0f}"
            f"{_ms(quiet['p50_ms']):>12} / {_ms(during['p50_ms']):<10}"
            f"{_ms(quiet['p99_ms']):>9} / {_ms(during['p99_ms']):<8}"
            f"{_ms(during['max_ms'], 1):>10} ms{ratio}"
        )
    print("\nSize per million rows (MB): table with TOAST, indexes")
    for table, size in sizes.items():
        print(f"  {table:<36}{size['table_mb']:>8.0f}{size['indexes_mb']:>8.0f}")


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    bench_main("tests.bench.retention", __doc__, add_arguments, run)
