"""One run: the cluster up, a destination registered with the real management command,
the events sent over both nodes while PgBouncer is restarted under them, everything
waited for, checked and reported (``run``; ``report_lines`` prints the report).

The restart comes once ``restart_at`` of the events' requests were answered: PgBouncer
is stopped (every client connection cut, mid-transaction for some), kept down for
``down_seconds`` and started again on the same port. Requests that failed meanwhile
are retried by the sender. A relay whose answers could not be recorded (its connection
cut between sending and recording) sends those messages again once their leases (the
destination's timeout + 30 s) run out, under the same keys: the wait for everything to
land allows for that.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import checks
from .cluster import MERCHANT_SECRET, Cluster, Layout
from .cpu import Sampler
from .merchant import Merchant
from .sender import Sender, plan

EVENT_TYPES = "order.paid,order.cancelled,order.fulfilled"
LEASE_MARGIN_SECONDS = 30  # at least the relay's lease margin (24 s by default)


@dataclass
class Options:
    events: int = 1200  # about: whole orders of 3 or 4 events each
    threads: int = 8
    duplicate_every: int = 4  # every n-th event to both nodes at once
    restart_at: float = 0.4  # share of the events answered before the restart (<0: none)
    down_seconds: float = 1.0
    rate: int = 40  # the destination's limits: starts a second, burst, in flight
    burst: int = 10
    concurrency: int = 4
    timeout: float = 2.0  # the destination's timeout (its lease is this + 24 s)
    merchant_delay: float = 0.05  # how long the merchant holds each request
    layout: Layout = field(default_factory=Layout)
    keep_logs: Path | None = None


def run(options: Options) -> dict[str, Any]:
    """Run the scenario; the report as a dict (``problems`` empty when all held)."""
    orders = max(1, round(options.events / (10 / 3)))  # 3 events an order, 4 if cancelled
    stories, expected = plan(uuid.uuid4().hex[:6], orders, options.duplicate_every)
    limits = checks.Limits(options.rate, options.burst, options.concurrency)
    report: dict[str, Any] = {"options": _options(options), "problems": []}
    with (
        Merchant(options.merchant_delay) as merchant,
        Cluster(options.layout, options.keep_logs) as cluster,
    ):
        report["startup_s"] = {k: round(v, 1) for k, v in cluster.timings.items()}
        cluster.manage(
            "webhook_destination", "add", "merchant", "--url", merchant.url,
            "--secret", MERCHANT_SECRET, "--events", EVENT_TYPES,
            "--rate", f"{options.rate}/s", "--burst", str(options.burst),
            "--concurrency", str(options.concurrency), "--timeout", str(options.timeout),
        )  # fmt: skip
        sender = Sender([(n.host, n.port) for n in cluster.nodes], options.threads)
        restart: dict[str, float] = {}
        restarter = threading.Thread(
            target=_restart_when,
            args=(cluster, sender, expected.receipts * options.restart_at, options, restart),
            daemon=True,
        )
        conn = cluster.connect()
        groups = {n.process.pid: "gunicorn" for n in cluster.nodes if n.process}
        groups |= {r.process.pid: "relay" for r in cluster.relays if r.process}
        groups |= {w.process.pid: "celery" for w in cluster.workers if w.process}
        if cluster.beat and cluster.beat.process:
            groups[cluster.beat.process.pid] = "beat"
        single = {merchant.process.pid: "merchant", cluster.redis.process.pid: "redis"}
        single[os.getpid()] = "sender"
        sampler = Sampler(groups, single, lambda: _changing(cluster, sample_conn))
        sample_conn = cluster.connect()
        try:
            with sampler:
                if options.restart_at >= 0:
                    restarter.start()
                sent = sender.run(stories)
                restarter.join(timeout=60)
                sending_s = sent.ended - sent.started
                budget = options.timeout + LEASE_MARGIN_SECONDS + 30
                state, waited = checks.wait_landed(conn, expected, budget)
            report["problems"] += checks.exactly_once(conn, expected)
            report["problems"] += checks.outbox(conn, expected)
            arrivals, most_in_flight, _ = merchant.stats()
            starts = checks.attempt_starts(conn)
        finally:
            conn.close()
            sample_conn.close()
        if not state.done(expected):
            report["problems"].append(f"not everything landed in {waited:.0f} s: {state}")
            report["logs"] = cluster.logs_tail()
    delivery = checks.delivery(arrivals, most_in_flight, starts, expected, limits)
    report["problems"] += delivery.problems
    if sent.given_up:
        report["problems"].append(f"{len(sent.given_up)} events given up by the sender")
    ok = [a for a in sent.attempts if sent.ok(a)]
    report["receive"] = {
        "events": expected.receipts,
        "requests": len(sent.attempts),
        "answered_ok": len(ok),
        "sending_s": round(sending_s, 2),
        "requests_per_s": round(len(sent.attempts) / sending_s, 1),
        "events_per_s": round(expected.receipts / sending_s, 1),
        "answers": dict(sent.answers()),
        "per_node": {n: sum(1 for a in ok if a.node == n) for n in range(len(cluster.nodes))},
    }
    report["relay"] = {
        "messages": len(expected.messages),
        "limits": asdict(limits),
        "landed_after_sending_s": round(waited, 1),
    } | {
        k: (round(v, 2) if isinstance(v, float) else v)
        for k, v in asdict(delivery).items()
        if k != "problems"
    }
    report["restart"] = _restart_figures(sent, restart)
    report["cpu_cores"] = sampler.usage.table()
    report["machine_busy"] = round(sampler.usage.machine_busy, 2)
    return report


def _changing(cluster: Cluster, conn) -> dict[int, str]:
    """The processes that come and go: PgBouncer (a new one after the restart) and the
    PostgreSQL backends serving the run's database."""
    found = {}
    if cluster.pgbouncer.process is not None:
        found[cluster.pgbouncer.process.pid] = "pgbouncer"
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)",
        [cluster.database, list(cluster.own_backends)],
    )
    return found | {pid: "postgres" for (pid,) in rows}


def _restart_when(
    cluster: Cluster, sender: Sender, answered: float, options: Options, out: dict[str, float]
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(1 for a in list(sender.sent.attempts) if a.code) >= answered:
            break
        time.sleep(0.02)
    out["stopped"] = time.monotonic()
    out["down_s"] = cluster.pgbouncer_restart(options.down_seconds)
    out["back"] = time.monotonic()


def _restart_figures(sent, restart: dict[str, float]) -> dict[str, Any]:
    if "stopped" not in restart:
        return {"restarted": False}
    stopped, back = restart["stopped"], restart["back"]
    failures = [a for a in sent.failures() if a.at >= stopped - 1]
    figures: dict[str, Any] = {
        "restarted": True,
        "down_s": round(restart["down_s"], 2),
        "failed_requests": len(failures),
        "failures": dict(sent.answers_of(failures)) if failures else {},
        "deferred_202": sum(1 for a in sent.attempts if a.code == 202),
    }
    if failures:
        last = max(a.at for a in failures)
        recovered = min((a.at for a in sent.attempts if sent.ok(a) and a.at > last), default=None)
        figures["last_failure_after_stop_s"] = round(last - stopped, 2)
        if recovered is not None:
            figures["recovered_after_stop_s"] = round(recovered - stopped, 2)
            figures["recovered_after_back_s"] = round(recovered - back, 2)
    return figures


def _options(options: Options) -> dict[str, Any]:
    values = asdict(options)
    values["keep_logs"] = str(options.keep_logs) if options.keep_logs else None
    return values


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report, for a terminal."""
    r, d, s = report["receive"], report["relay"], report["restart"]
    layout = report["options"]["layout"]
    lines = [
        f"layout: {layout['nodes']} nodes × {layout['web_workers']} gunicorn workers, "
        f"{layout['relays']} relays, {layout['workers']} Celery worker(s) × "
        f"{layout['worker_concurrency']}, one PgBouncer "
        f"(transaction, default_pool_size {layout['pool_size']}), start-up {report['startup_s']}",
        f"received: {r['requests']} requests for {r['events']} events in {r['sending_s']} s: "
        f"{r['requests_per_s']} req/s over both nodes ({r['events_per_s']} new events/s); "
        f"per node {r['per_node']}; answers {r['answers']}",
        f"relayed: {d['distinct']}/{d['messages']} messages, {d['per_second']} deliveries/s; "
        f"max in flight {d['most_in_flight']} (limit {d['limits']['concurrency']}); worst second "
        f"{d['worst_1s_arrivals']} arrivals, {d['worst_1s_starts']} starts (rate + burst "
        f"{d['limits']['rate']} + {d['limits']['burst']}); re-sent under the same key "
        f"{d['resent']}; all landed {d['landed_after_sending_s']} s after the last request",
    ]
    if s.get("restarted"):
        lines.append(
            f"PgBouncer restart: down {s['down_s']} s; {s['failed_requests']} requests failed "
            f"({s['failures']}), the last {s.get('last_failure_after_stop_s', '-')} s after "
            f"the stop; answered again {s.get('recovered_after_stop_s', '-')} s after the stop "
            f"({s.get('recovered_after_back_s', '-')} s after it was back); "
            f"{s['deferred_202']} deferred (202) and retried by the app"
        )
    lines.append(f"CPU (cores): {report['cpu_cores']}; machine busy {report['machine_busy']:.0%}")
    lines.append("problems: " + ("; ".join(report["problems"]) or "none"))
    return lines
