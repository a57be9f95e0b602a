"""Growth: the full path with a million receipts stored, against the empty database.

    python -m tests.bench.growth [--rows N] [--growth-rounds R] [--rebuild]

A second bench database (BENCH_LARGE_DATABASE_URL, ``webhook_receiver_bench_large``)
holds N receipts (1,000,000) spread over the last 30 days, and as many audit records,
written with ``INSERT … SELECT generate_series`` as the receive path writes them
(``msg_`` + 32 hex digits for keys, so they are spread over the key index as random
message ids are). A tenth more receipts, 36 to 40 days old, go in first; the receipts'
retention (``purge_receipts``, when it exists) deletes them before measuring, so the table
is at retention's steady state: the rows gone, their space left as holes (VACUUM, never
FULL), the indexes split by a million random inserts. It is built once and reused while
its schema (no unapplied migration) and its row count hold; ``--rebuild`` builds it
again. A run first deletes what earlier runs added (keys ``msg_full_…``).

A second gunicorn (2 sync workers) serves it while the first, on the bench database,
idles; rounds alternate between the two, each side's new events then duplicates
(the same bodies, re-signed), the side that goes first alternating. The ratios
large / empty of req/s are the median of the per-round ratios; target >= 0.9. Then, for
each database, the buffers the receipts' and audit records' tables and indexes read per
request (hits in shared_buffers, and reads: misses, from the OS cache or the disk), the
index sizes, and EXPLAIN (ANALYZE, BUFFERS) of the claim statements
(``inbound/queries.py``) for new and known keys. Writes bench-results/growth.json.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import environ

from .cli import bench_main
from .common import DEFAULT_DATABASE_URL, FULL_PATH
from .load import event_bodies, run_phase, signed_requests
from .report import Stats, stats_of, write_section
from .server import (
    BASE_DIR,
    RESULTS_DIR,
    GunicornServer,
    _connect,
    bench_env,
    database_analyze,
    database_migrate,
    database_prepare,
    database_recreate,
    git_commit,
)

LARGE_DATABASE_URL = os.environ.get(
    "BENCH_LARGE_DATABASE_URL",
    DEFAULT_DATABASE_URL.rsplit("/", 1)[0] + "/webhook_receiver_bench_large",
)
EMPTY, LARGE = "empty", "large"
NEW, DUPLICATE = "new", "duplicate"
TARGET = 0.90
WARMUP_REQUESTS = 300
# an idle backend reports its table and index counters within 10 s (PostgreSQL 15+)
STATS_FLUSH_SECONDS = 11
PAST_SHARE = 0.10  # receipts past retention, which the purge deletes
RECEIPTS = "webhook_receiver_webhookreceipt"
AUDIT = "webhook_receiver_requestaudit"
LEDGER = "shop_inventoryledgerentry"
MARKER = "bench_growth_fill"
RUN_KEYS = "msg\\_full\\_%"  # what runs add (load.signed_requests' prefix for the full path)

# $total receipts in time order: the first $past 40 to 36 days old (past the 35 days of
# retention), the other $rows over the last 30 days. Bodies, headers and outcomes as the
# receive path stores them for the bench's events.
FILL_RECEIPTS = f"""
    INSERT INTO {RECEIPTS} (source, event_key, event_type, message_id, signature_timestamp,
        body, headers, status, subject, outcome, received_at)
    SELECT 'shop', k, 'inventory.reserved', k, t - interval '1 second',
        convert_to('{{"type": "inventory.reserved", "timestamp": '
            || extract(epoch FROM t)::bigint || ', "data": {{"order_id": "ord-fill-' || i
            || '", "version": 1, "lines": [{{"sku": "sku-' || i %% 97
            || '", "quantity": 1}}, {{"sku": "sku-' || (i + 1) %% 97
            || '", "quantity": 2}}]}}}}', 'UTF8'),
        jsonb_build_object('content-type', 'application/json', 'webhook-id', k,
            'webhook-timestamp', extract(epoch FROM t)::bigint::text,
            'webhook-signature', '[redacted]'),
        'applied', 'ord-fill-' || i, jsonb_build_object('status', 'applied', 'event_key', k),
        t
    FROM generate_series(1, %(total)s) AS i,
        LATERAL (SELECT 'msg_' || md5('fill' || i) AS k,
            CASE WHEN i <= %(past)s
                THEN now() - interval '40 days' + (4.0 * 86400 * i / %(past)s) * interval '1 s'
                ELSE now() - (30.0 * 86400 * (%(total)s - i) / %(rows)s) * interval '1 s'
            END AS t) AS v
"""
# One audit record a receipt within the audit's 30 days of retention, in time order.
FILL_AUDIT = f"""
    INSERT INTO {AUDIT} (source, message_id, event_key, signature_timestamp,
        verification, result, response_status, body_sha256, body_size, remote_addr,
        received_at)
    SELECT source, message_id, event_key, signature_timestamp, 'verified', 'applied', 200,
        encode(sha256(body), 'hex'), length(body), '127.0.0.1', received_at
    FROM {RECEIPTS} WHERE received_at >= now() - interval '30 days' ORDER BY received_at
"""


# --- the large database -----------------------------------------------------------------


def _run_keys_delete(conn: Any) -> int:
    """What earlier runs added: their receipts, audit records and ledger rows."""
    deleted = 0
    for table in (RECEIPTS, AUDIT, LEDGER):
        deleted += conn.execute(
            f"DELETE FROM {table} WHERE event_key LIKE %s", (RUN_KEYS,)
        ).rowcount
    return deleted


def _database_exists(url: str) -> bool:
    name = environ.Env.db_url_config(url)["NAME"]
    with _connect(url, dbname="postgres") as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


def _migrations_applied(env: dict[str, str]) -> bool:
    check = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--check", "--verbosity", "0"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        timeout=120,
    )
    return check.returncode == 0


def reusable(url: str, env: dict[str, str], rows: int) -> str | None:
    """Why the large database cannot be reused, or None if it can."""
    if not _database_exists(url):
        return "it does not exist"
    if not _migrations_applied(env):
        return "its schema is not the code's (unapplied migrations)"
    with _connect(url) as conn:
        marked = conn.execute("SELECT to_regclass(%s)", (MARKER,)).fetchone()[0]
        if marked is None:
            return "it has no record of its fill"
        built_rows = conn.execute(f"SELECT rows FROM {MARKER}").fetchone()
        if built_rows is None or built_rows[0] != rows:
            return f"it was filled with {built_rows and built_rows[0]} rows, not {rows}"
        stored = conn.execute(
            f"SELECT count(*) FROM {RECEIPTS} WHERE event_key NOT LIKE %s", (RUN_KEYS,)
        ).fetchone()[0]
    if not 0.98 * rows <= stored <= rows:
        return f"it holds {stored:,} filled receipts, not about {rows:,}"
    return None


def large_build(url: str, env: dict[str, str], rows: int) -> float:
    """Recreate, migrate and fill the large database; return the seconds it took."""
    started = time.perf_counter()
    past = int(rows * PAST_SHARE)
    database_recreate(url)
    database_migrate(env)
    with _connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '256MB'")
        step = time.perf_counter()
        conn.execute(FILL_RECEIPTS, {"total": rows + past, "past": past, "rows": rows})
        print(f"  receipts: {rows + past:,} in {time.perf_counter() - step:.0f} s", flush=True)
        step = time.perf_counter()
        conn.execute(FILL_AUDIT)
        print(f"  audit records: in {time.perf_counter() - step:.0f} s", flush=True)
        conn.execute(
            f"CREATE TABLE {MARKER} (rows bigint NOT NULL, past bigint NOT NULL, "
            "built_at timestamptz NOT NULL)"
        )
        conn.execute(f"INSERT INTO {MARKER} VALUES (%s, %s, now())", (rows, past))
        conn.execute(f"VACUUM ANALYZE {RECEIPTS}")
        conn.execute(f"VACUUM ANALYZE {AUDIT}")
    return time.perf_counter() - started


def _purge_job(env: dict[str, str], out: Any) -> None:
    os.environ.update(env)
    import django

    django.setup()
    try:  # written alongside this bench: it may not be there yet
        from webhook_receiver.inbound.retention import purge_receipts
    except ImportError as exc:
        out.put({"missing": str(exc)})
        return
    started = time.perf_counter()
    deleted = purge_receipts()
    out.put({"deleted": deleted, "seconds": time.perf_counter() - started})


def answer_of(job: Callable[..., None], *args: Any, timeout: float) -> dict[str, Any]:
    """What ``job(*args, out)`` puts on ``out``, run in a fresh (spawned) process, so
    that its Django set-up is its own."""
    context = mp.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=job, args=(*args, out), daemon=True)
    process.start()
    try:
        return out.get(timeout=timeout)
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()


def receipts_purge_run(env: dict[str, str]) -> dict[str, Any]:
    """``purge_receipts()`` once on the large database, in a process of its own."""
    return answer_of(_purge_job, env, timeout=600)


def large_prepare(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The large database at retention's steady state, built or reused."""
    url = LARGE_DATABASE_URL
    name = url.rsplit("/", 1)[1]
    why = "--rebuild" if args.rebuild else reusable(url, env, args.rows)
    info: dict[str, Any] = {"database": name}
    if why is None:
        with _connect(url) as conn:
            deleted = _run_keys_delete(conn)
            built_at = conn.execute(f"SELECT built_at FROM {MARKER}").fetchone()[0]
        print(
            f"reusing {name} (built {built_at:%Y-%m-%d %H:%M}); "
            f"{deleted:,} rows of earlier runs deleted",
            flush=True,
        )
        info |= {"reused": True, "built_at": built_at.isoformat()}
    else:
        print(f"building {name} ({why}): {args.rows:,} receipts and audit records ...")
        seconds = large_build(url, env, args.rows)
        info |= {"reused": False, "build_seconds": seconds}
    purge = receipts_purge_run(env)
    if "missing" in purge:
        print(f"  purge_receipts not found ({purge['missing']}): the prune is skipped")
    else:
        print(
            f"  purge_receipts: {purge['deleted']:,} receipts deleted in {purge['seconds']:.1f} s"
        )
    info["purge"] = purge
    with _connect(url) as conn:
        conn.execute(f"VACUUM ANALYZE {RECEIPTS}")  # holes left: space for new rows
        conn.execute(f"VACUUM ANALYZE {AUDIT}")
        conn.execute(f"VACUUM ANALYZE {LEDGER}")
        # what the fill, the clean-up and the purge dirtied is written out now, not by a
        # checkpoint in the middle of the rounds
        conn.execute("CHECKPOINT")
        info["receipts"], info["audit_records"] = conn.execute(
            f"SELECT (SELECT count(*) FROM {RECEIPTS}), (SELECT count(*) FROM {AUDIT})"
        ).fetchone()
    print(f"  {info['receipts']:,} receipts, {info['audit_records']:,} audit records", flush=True)
    return info


# --- where the cost goes ---------------------------------------------------------------

IO_TABLES = (RECEIPTS, AUDIT, LEDGER)


def io_snapshot(url: str) -> dict[str, dict[str, int]]:
    """Buffers hit and read so far, per table: heap (with TOAST) and indexes."""
    with _connect(url) as conn:
        rows = conn.execute(
            "SELECT relname, coalesce(heap_blks_hit, 0) + coalesce(toast_blks_hit, 0), "
            "coalesce(heap_blks_read, 0) + coalesce(toast_blks_read, 0), "
            "coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0) "
            "FROM pg_statio_user_tables WHERE relname = ANY(%s)",
            (list(IO_TABLES),),
        ).fetchall()
    return {
        name: {"heap_hit": hh, "heap_read": hr, "idx_hit": ih, "idx_read": ir}
        for name, hh, hr, ih, ir in rows
    }


def io_per_request(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], requests: int
) -> dict[str, dict[str, float]]:
    return {
        table: {key: (after[table][key] - before[table][key]) / requests for key in after[table]}
        for table in after
    }


def relation_sizes(url: str) -> dict[str, float]:
    """Each receipts' and audit records' table (with TOAST) and index, in MB."""
    with _connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_table_size(c.oid) FROM pg_class c "
            "WHERE c.relname = ANY(%(t)s) UNION ALL "
            "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) "
            "FROM pg_index i WHERE i.indrelid::regclass::text = ANY(%(t)s) ORDER BY 1",
            {"t": [RECEIPTS, AUDIT]},
        ).fetchall()
    return {name: size / 2**20 for name, size in rows}


def _explain_job(urls: dict[str, str], out: Any) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.bench.settings")
    import django

    django.setup()
    from webhook_receiver.inbound import queries

    out.put({side: _explain_all(url, queries) for side, url in urls.items()})


def _explain_all(url: str, queries: Any) -> dict[str, Any]:
    """The claim of new keys (random ones, which land anywhere in the key index, and keys
    like the bench's, which sort together) and of stored ones, a duplicate's (a key of
    the fill, anywhere in the index; a key the last round added), 5 of each."""
    from psycopg.types.json import Jsonb

    now = datetime.now(UTC)
    with _connect(url) as conn:
        recent = [
            k
            for (k,) in conn.execute(
                f"SELECT event_key FROM {RECEIPTS} WHERE event_key LIKE %s "
                "ORDER BY id DESC LIMIT 5",
                (RUN_KEYS,),
            )
        ]
        old = [
            k
            for (k,) in conn.execute(
                f"SELECT event_key FROM {RECEIPTS} WHERE event_key NOT LIKE %s "
                "ORDER BY id LIMIT 5 OFFSET 1000",
                (RUN_KEYS,),
            )
        ] or recent
        random_keys = [f"msg_{os.urandom(16).hex()}" for _ in range(5)]
        bench_like = [f"msg_full_explain_{i}" for i in range(5)]
        cases = {
            "claim, new random key": (queries.CLAIM_AUDITED, random_keys),
            "claim, new key like the bench's": (queries.CLAIM_AUDITED, bench_like),
            "claim, stored key (a duplicate)": (queries.CLAIM_AUDITED, old),
            "claim, recent key (a duplicate)": (queries.CLAIM_AUDITED, recent),
        }
        found = {}
        for name, (statement, keys) in cases.items():
            plans = []
            for key in keys:
                params = {
                    "source": "shop", "event_key": key, "event_type": "inventory.reserved",
                    "message_id": key, "signature_timestamp": None, "status": "applied",
                    "subject": "ord-explain", "outcome": Jsonb({"status": "applied"}),
                    "body": b"{}", "headers": Jsonb({}), "received_at": now,
                    "verification": "verified", "body_sha256": "0" * 64, "body_size": 2,
                    "remote_addr": "127.0.0.1", "result": "applied",
                    "secret_fingerprint": None,
                }  # fmt: skip
                with conn.transaction(force_rollback=True):
                    plan = conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params
                    ).fetchone()[0][0]
                plans.append(plan)
            found[name] = {
                "ms": statistics.median(p["Execution Time"] for p in plans),
                "hit": statistics.median(_buffers(p["Plan"], "Shared Hit Blocks") for p in plans),
                "read": statistics.median(_buffers(p["Plan"], "Shared Read Blocks") for p in plans),
                "dirtied": statistics.median(
                    _buffers(p["Plan"], "Shared Dirtied Blocks") for p in plans
                ),
            }
    return found


def _buffers(plan: dict[str, Any], key: str) -> int:
    """A plan's buffers: the top node's, which include its children's (InitPlans and
    CTEs too)."""
    return int(plan.get(key, 0))


def explain(urls: dict[str, str]) -> dict[str, Any]:
    return answer_of(_explain_job, urls, timeout=120)


# --- the rounds ------------------------------------------------------------------------


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU so far of these processes (those that are gone: nothing)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class PhaseCost:
    """What one phase cost, per request: the WAL it wrote (the cluster's, but only this
    side is served then), the CPU of its database's backends and of its gunicorn
    workers. The other server idles meanwhile; other tenants' work is not excluded."""

    def __init__(self, url: str, server: GunicornServer) -> None:
        self.conn = _connect(url)
        self.dbname = environ.Env.db_url_config(url)["NAME"]
        assert server.process is not None
        self.master = server.process.pid

    def _sample(self) -> tuple[int, list[int], list[int]]:
        lsn, pids = self.conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, array_agg(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            (self.dbname,),
        ).fetchone()
        return int(lsn), list(pids or []), _children(self.master)

    def measure(self, run: Any, requests: int) -> tuple[Stats, dict[str, float]]:
        lsn, backends, workers = self._sample()
        pg_cpu, worker_cpu = _cpu_seconds(backends), _cpu_seconds(workers)
        stats = run()
        after_lsn, _, _ = self._sample()
        return stats, {
            "wal_bytes": (after_lsn - lsn) / requests,
            "pg_cpu_ms": (_cpu_seconds(backends) - pg_cpu) * 1000 / requests,
            "worker_cpu_ms": (_cpu_seconds(workers) - worker_cpu) * 1000 / requests,
        }

    def close(self) -> None:
        self.conn.close()


def _phase(server: GunicornServer, phase: str, bodies: list[bytes], tag: str) -> Stats:
    requests = signed_requests(
        host=f"{server.host}:{server.port}",
        path=FULL_PATH,
        bodies=bodies,
        msg_prefix=f"msg_full_{tag}",
        expected_status="applied" if phase == NEW else "duplicate",
    )
    return stats_of(run_phase(server.host, server.port, requests, 4))


Costs = dict[str, dict[str, list[dict[str, float]]]]


def growth_rounds(
    args: argparse.Namespace, servers: dict[str, GunicornServer], urls: dict[str, str]
) -> tuple[dict[str, dict[str, list[Stats]]], Costs]:
    rounds: dict[str, dict[str, list[Stats]]] = {side: {NEW: [], DUPLICATE: []} for side in servers}
    costs: Costs = {side: {NEW: [], DUPLICATE: []} for side in servers}
    meters = {side: PhaseCost(urls[side], servers[side]) for side in servers}
    try:
        for number in range(args.growth_rounds):
            tag = f"g{number}"
            bodies = event_bodies(args.requests, tag)
            order = [EMPTY, LARGE] if number % 2 == 0 else [LARGE, EMPTY]
            for phase in (NEW, DUPLICATE):
                for side in order:
                    stats, cost = meters[side].measure(
                        functools.partial(_phase, servers[side], phase, bodies, tag), len(bodies)
                    )
                    rounds[side][phase].append(stats)
                    costs[side][phase].append(cost)
                    print(
                        f"  round {number + 1}/{args.growth_rounds} {side:<6} {phase:<10} "
                        f"{stats.rps:8.1f} req/s  p50 {stats.p50_ms:.2f} ms"
                        f"{f'  !! {stats.errors} errors' if stats.errors else ''}",
                        flush=True,
                    )
    finally:
        for meter in meters.values():
            meter.close()
    return rounds, costs


def summary(rounds: dict[str, dict[str, list[Stats]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"medians": {}, "ratios": {}}
    for side, phases in rounds.items():
        out["medians"][side] = {
            phase: {
                "rps": statistics.median(s.rps for s in stats),
                "p50_ms": statistics.median(s.p50_ms for s in stats),
                "p99_ms": statistics.median(s.p99_ms for s in stats),
                "errors": sum(s.errors for s in stats),
            }
            for phase, stats in phases.items()
        }
    for phase in (NEW, DUPLICATE):
        pairs = zip(rounds[LARGE][phase], rounds[EMPTY][phase], strict=True)
        per_round = [large.rps / empty.rps for large, empty in pairs]
        out["ratios"][phase] = {
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "per_round": per_round,
        }
    return out


def render(result: dict[str, Any], config: dict[str, Any]) -> str:
    large = result["large"]
    lines = [
        f"growth benchmark: the full path on {large['receipts']:,} receipts and "
        f"{large['audit_records']:,} audit records ({large['database']}, "
        f"{'reused' if large['reused'] else 'built this run'}) against the bench database, "
        f"{config['requests']} requests a phase, median of {config['rounds']} rounds",
        "",
        f"{'database':<8} {'phase':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}",
    ]
    for side in (EMPTY, LARGE):
        for phase in (NEW, DUPLICATE):
            m = result["medians"][side][phase]
            lines.append(
                f"{side:<8} {phase:<10} {m['rps']:>8.1f} {m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f}"
            )
    lines += ["", "large / empty req/s (median of per-round ratios; min-max)"]
    below = False
    for phase in (NEW, DUPLICATE):
        r = result["ratios"][phase]
        verdict = "PASS" if r["median"] >= TARGET else "BELOW"
        below |= r["median"] < TARGET
        lines.append(
            f"  {phase:<10} {r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]  "
            f"target >= {TARGET:.2f} {verdict}"
        )
    lines += ["", "cost a request (median of rounds): WAL bytes, PostgreSQL CPU, gunicorn CPU"]
    for phase in (NEW, DUPLICATE):
        for side in (EMPTY, LARGE):
            c = result["costs"][side][phase]
            lines.append(
                f"  {phase:<10} {side:<6} {c['wal_bytes']:7.0f} B  {c['pg_cpu_ms']:6.3f} ms"
                f"  {c['worker_cpu_ms']:6.3f} ms"
            )
    lines += ["", "buffers a request during the rounds (hit in shared_buffers / read: missed)"]
    for side in (EMPTY, LARGE):
        for table, io in result["io"][side].items():
            lines.append(
                f"  {side:<6} {table:<34} heap {io['heap_hit']:5.1f} / {io['heap_read']:4.2f}"
                f"   indexes {io['idx_hit']:5.1f} / {io['idx_read']:4.2f}"
            )
    if "explain" in result:
        lines += ["", "EXPLAIN (ANALYZE, BUFFERS), median of 5 keys: ms, buffers hit / read"]
        for name in result["explain"][EMPTY]:
            e, g = result["explain"][EMPTY][name], result["explain"][LARGE][name]
            lines.append(
                f"  {name:<32} empty {e['ms']:6.3f} ms {e['hit']:4.0f} / {e['read']:<3.0f}"
                f"  large {g['ms']:6.3f} ms {g['hit']:4.0f} / {g['read']:.0f}"
            )
    sizes = result["sizes"][LARGE]
    lines += ["", "sizes on the large database, MB (shared_buffers: "
              f"{result['shared_buffers']})"]  # fmt: skip
    lines += [f"  {name:<40} {size:8.1f}" for name, size in sizes.items()]
    if below:
        lines.append(
            "\nBELOW target: compare the buffers read a request and the claim's EXPLAIN above"
        )
    return "\n".join(lines)


def bench_growth(args: argparse.Namespace, empty: GunicornServer, empty_url: str) -> dict[str, Any]:
    """The growth section, beside a running server on the (near) empty bench database."""
    print(f"\ngrowth: the full path on {args.rows:,} receipts against the bench database")
    large_env = bench_env(LARGE_DATABASE_URL)
    large = large_prepare(args, large_env)
    urls = {EMPTY: empty_url, LARGE: LARGE_DATABASE_URL}
    with GunicornServer(large_env, RESULTS_DIR / "gunicorn-large.log") as server:
        print(f"  serving the large database on {server.host}:{server.port}, 2 sync workers")
        servers = {EMPTY: empty, LARGE: server}
        # warm-up: both servers' workers connect and fill their caches; figures discarded
        warmup = event_bodies(WARMUP_REQUESTS, "gwarmup")
        for side in servers:
            for phase in (NEW, DUPLICATE):
                _phase(servers[side], phase, warmup, "gwarmup")
        # statistics for the rows just added, as autovacuum would gather them (this
        # machine's PostgreSQL runs without it): a table never analyzed since it was
        # empty gets plans for an empty table
        for url in urls.values():
            database_analyze(url)
        time.sleep(STATS_FLUSH_SECONDS)  # the warm-up's counters, in before the snapshot
        before = {side: io_snapshot(url) for side, url in urls.items()}
        rounds, costs = growth_rounds(args, servers, urls)
        time.sleep(STATS_FLUSH_SECONDS)
        after = {side: io_snapshot(url) for side, url in urls.items()}
    requests = 2 * args.requests * args.growth_rounds
    result = summary(rounds) | {"large": large}
    result["costs"] = {
        side: {
            phase: {key: statistics.median(c[key] for c in cs) for key in cs[0]}
            for phase, cs in phases.items()
        }
        for side, phases in costs.items()
    }
    result["io"] = {side: io_per_request(before[side], after[side], requests) for side in urls}
    result["sizes"] = {side: relation_sizes(url) for side, url in urls.items()}
    with _connect(empty_url) as conn:
        result["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
    try:
        result["explain"] = explain(urls)
    except Exception as exc:  # the figures above stand without it
        print(f"  EXPLAIN failed: {type(exc).__name__}: {exc}")
    result["rounds"] = {
        side: {phase: [asdict(s) for s in stats] for phase, stats in phases.items()}
        for side, phases in rounds.items()
    }
    config = {
        "commit": git_commit(),
        "rows": args.rows,
        "requests": args.requests,
        "rounds": args.growth_rounds,
        "gunicorn_workers": 2,
        "cpu_count": os.cpu_count(),
    }
    print()
    print(render(result, config))
    write_section(args.growth_output, config, result)
    return result


def failed(result: dict[str, Any]) -> bool:
    return any(m["errors"] for phases in result["medians"].values() for m in phases.values())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="receipts stored")
    parser.add_argument("--growth-rounds", type=int, default=7)
    parser.add_argument(
        "--rebuild", action="store_true", help="build the large database again even if reusable"
    )
    parser.add_argument("--growth-output", type=Path, default=RESULTS_DIR / "growth.json")


def arguments_alone(parser: argparse.ArgumentParser) -> None:
    """Run alone, the section also takes the receive bench's phase length."""
    parser.add_argument("--requests", type=int, default=1000, help="requests a phase")
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    env = database_prepare(database_url)
    with GunicornServer(env, RESULTS_DIR / "gunicorn.log") as server:
        print(f"serving the bench database on {server.host}:{server.port}, 2 sync workers")
        result = bench_growth(args, server, database_url)
    return 1 if failed(result) else 0


if __name__ == "__main__":
    bench_main(
        "tests.bench.growth", __doc__, arguments_alone, run, stopped="the servers were stopped"
    )
