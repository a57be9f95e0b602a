"""The figures of docs/deploying.md: ``python -m tests.multinode --measure [--repeat N]``.

- receive: new events (``inventory.reserved``, no duplicates) sent over both nodes by
  ``--threads`` sender threads, with 1, 2 and 4 gunicorn workers a node, each layout
  ``--repeat`` times, in an order that alternates (1 2 4 4 2 1 …), so that none gets
  all of a shared machine's quiet moments;
- relay: a backlog of ``--messages`` outbox messages, admitted while their destinations
  are disabled, then enabled at once: deliveries a second at a merchant that answers at
  once, with limits that do not bind, to 1 destination and to 4 (the relay works one
  destination's rounds one claimer at a time; several spread over both workers).

Every phase samples the CPU of each role (``tests.multinode.cpu``). Results as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from .cluster import MERCHANT_SECRET, Cluster, Layout
from .cpu import Sampler
from .merchant import Merchant
from .sender import Event, Sender, _body

ADMIT = """
from django.db import transaction
from webhook_receiver.outbound import enqueue_webhook, message_key
names, count = {names!r}, {count}
for first in range(0, count, 500):
    with transaction.atomic():
        for i in range(first, min(first + 500, count)):
            order = f"ord-m-{{i}}"
            data = {{"order_id": order, "status": "paid", "version": 1}}
            key = message_key("order", order, "paid", 1)
            enqueue_webhook(names[i % len(names)], "order.paid", key,
                {{"type": "order.paid", "data": data}}, ordering_key=f"order:{{order}}")
"""


def _roles(cluster: Cluster, merchant: Merchant | None, conn) -> Sampler:
    groups = {n.process.pid: "gunicorn" for n in cluster.nodes if n.process}
    groups |= {r.process.pid: "relay" for r in cluster.relays if r.process}
    groups |= {w.process.pid: "celery" for w in cluster.workers if w.process}
    if cluster.beat and cluster.beat.process:
        groups[cluster.beat.process.pid] = "beat"
    single = {os.getpid(): "sender", cluster.redis.process.pid: "redis"}
    if merchant is not None:
        single[merchant.process.pid] = "merchant"

    def changing() -> dict[int, str]:
        found = {cluster.pgbouncer.process.pid: "pgbouncer"} if cluster.pgbouncer.process else {}
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)",
            [cluster.database, list(cluster.own_backends)],
        )
        return found | {pid: "postgres" for (pid,) in rows}

    return Sampler(groups, single, changing)


def receive_once(web_workers: int, events: int, threads: int, pool_size: int) -> dict[str, Any]:
    layout = Layout(
        web_workers=web_workers, workers=1, worker_concurrency=1, pool_size=pool_size, beat=False
    )
    with Cluster(layout) as cluster, cluster.connect() as conn:
        nodes = [(n.host, n.port) for n in cluster.nodes]
        tag = f"w{web_workers}-{time.monotonic_ns()}"

        def stories(count: int, prefix: str) -> list[list[Event]]:
            lines = [{"sku": "sku-1", "quantity": 1}, {"sku": "sku-2", "quantity": 2}]
            return [
                [
                    Event(
                        f"{prefix}-{i}",
                        _body("inventory.reserved", order_id=f"o{i}", version=1, lines=lines),
                        False,
                    )
                ]
                for i in range(count)
            ]

        Sender(nodes, threads).run(stories(min(200, events), f"warm-{tag}"))  # connections, imports
        with _roles(cluster, None, conn) as sampler:
            sent = Sender(nodes, threads).run(stories(events, tag))
        seconds = sent.ended - sent.started
        latencies = sorted(a.seconds * 1000 for a in sent.attempts)
        return {
            "web_workers": web_workers,
            "events_per_s": round(events / seconds, 1),
            "p50_ms": round(latencies[len(latencies) // 2], 1),
            "failed": len(sent.failures()),
            "cpu_cores": sampler.usage.table(),
            "cpu_ms_per_event": sampler.usage.per_item_ms(events),
            "machine_busy": round(sampler.usage.machine_busy, 2),
        }


def relay_once(destinations: int, messages: int, pool_size: int) -> dict[str, Any]:
    layout = Layout(web_workers=1, pool_size=pool_size)
    with Merchant(0.0) as merchant, Cluster(layout) as cluster, cluster.connect() as conn:
        names = [f"merchant-{n}" for n in range(1, destinations + 1)]
        for name in names:
            cluster.manage(
                "webhook_destination", "add", name, "--url", merchant.url, "--secret",
                MERCHANT_SECRET, "--events", "order.paid", "--rate", "100000/s",
                "--concurrency", "10", "--timeout", "5",
            )  # fmt: skip
            cluster.manage("webhook_destination", "disable", name)
        cluster.manage("shell", "-c", ADMIT.format(names=names, count=messages))
        conn.execute("ANALYZE")
        with _roles(cluster, merchant, conn) as sampler:
            enabling = [
                threading.Thread(target=cluster.manage, args=("webhook_destination", "enable", n))
                for n in names
            ]
            for thread in enabling:
                thread.start()
            for thread in enabling:
                thread.join(timeout=60)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                arrivals, _, _ = merchant.stats()
                if len({a.key for a in arrivals}) >= messages:
                    break
                time.sleep(0.5)
        times = sorted(a.at for a in arrivals)
        seconds = times[-1] - times[0] if len(times) > 1 else float("nan")
        return {
            "destinations": destinations,
            "delivered": len({a.key for a in arrivals}),
            "deliveries_per_s": round((len(times) - 1) / seconds, 1),
            "cpu_ms_per_delivery": sampler.usage.per_item_ms(max(1, len(times))),
            "machine_busy": round(sampler.usage.machine_busy, 2),
        }


def _spread(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str], out: Path | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.multinode --measure")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--events", type=int, default=2000, help="new events a receive run")
    parser.add_argument("--messages", type=int, default=4000, help="messages a relay run")
    parser.add_argument("--threads", type=int, default=16, help="sender threads")
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--skip", choices=["receive", "relay"], action="append", default=[])
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"cores": os.cpu_count(), "args": vars(args)}
    if "receive" not in args.skip:
        order = [1, 2, 4]
        runs = []
        for n in range(args.repeat):
            for workers in order if n % 2 == 0 else order[::-1]:
                run = receive_once(workers, args.events, args.threads, args.pool_size)
                print(json.dumps(run), flush=True)
                runs.append(run)
        results["receive"] = {
            w: _spread([r for r in runs if r["web_workers"] == w], "events_per_s") for w in order
        }
        results["receive_runs"] = runs
    if "relay" not in args.skip:
        runs = []
        for n in range(args.repeat):
            for destinations in (1, 4) if n % 2 == 0 else (4, 1):
                run = relay_once(destinations, args.messages, args.pool_size)
                print(json.dumps(run), flush=True)
                runs.append(run)
        results["relay"] = {
            d: _spread([r for r in runs if r["destinations"] == d], "deliveries_per_s")
            for d in (1, 4)
        }
        results["relay_runs"] = runs
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_runs")}, indent=2))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    return 0
