"""What a run must show, read straight from PostgreSQL (not through the pooler) and from
the merchant's record: each a list of problems, empty when it holds.

- exactly once: one receipt per event, the ledger's rows and sums, each order's state;
- nothing left behind: no failed event still retrying, every outbox message delivered;
- the destination's limits across both workers: in flight at the merchant never above
  its concurrency; in any window of T seconds at most rate·T + burst starts (the token
  bucket's promise, on the relay's recorded starts) and, at the merchant, at most rate +
  burst arrivals in any second (+1 for the arrivals' own jitter);
- every message arrived, each order's in order; a key that arrived twice is a re-send
  after an answer that could not be recorded (at least once, under the same key).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from tests.support.limits import bucket_excess, worst_window

from .merchant import Arrival
from .sender import Expected

ARRIVAL_SLACK = 1  # an arrival trails its start by the request's own time
BUCKET_SLACK = 1.0
ACTIVE_GAP = 2.0  # a start is stamped a moment after the claim that spent its token


@dataclass
class Landed:
    receipts: int
    retrying: int
    messages: int
    delivered: int

    def done(self, expected: Expected) -> bool:
        return (
            self.receipts >= expected.receipts
            and self.retrying == 0
            and self.delivered >= len(expected.messages)
        )


def landed(conn: psycopg.Connection) -> Landed:
    receipts = conn.execute(
        "SELECT count(*) FROM webhook_receiver_webhookreceipt WHERE source = 'shop'"
    ).fetchone()[0]
    retrying = conn.execute(
        "SELECT count(*) FROM webhook_receiver_failedevent WHERE status = 'retrying'"
    ).fetchone()[0]
    messages, delivered = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'delivered') "
        "FROM webhook_receiver_outboxmessage"
    ).fetchone()
    return Landed(receipts, retrying, messages, delivered)


def wait_landed(
    conn: psycopg.Connection, expected: Expected, seconds: float
) -> tuple[Landed, float]:
    """Poll until everything landed or ``seconds`` passed; the last state and the wait."""
    began = time.monotonic()
    while True:
        state = landed(conn)
        if state.done(expected) or time.monotonic() - began > seconds:
            return state, time.monotonic() - began
        time.sleep(0.25)


def exactly_once(conn: psycopg.Connection, expected: Expected) -> list[str]:
    problems = []
    rows = conn.execute(
        "SELECT count(*), count(DISTINCT event_key), count(*) FILTER (WHERE status = 'applied') "
        "FROM webhook_receiver_webhookreceipt WHERE source = 'shop'"
    ).fetchone()
    if rows != (expected.receipts,) * 3:
        problems.append(
            f"receipts (all, distinct keys, applied) {rows}, expected {expected.receipts} each"
        )
    failed = dict(
        conn.execute(
            "SELECT status, count(*) FROM webhook_receiver_failedevent GROUP BY status"
        ).fetchall()
    )
    if set(failed) - {"resolved"}:
        problems.append(f"failed events not resolved: {failed}")
    stock, ledger_rows = Counter(), 0
    for sku, total, count in conn.execute(
        "SELECT sku, sum(delta), count(*) FROM shop_inventoryledgerentry GROUP BY sku"
    ):
        stock[sku] = int(total)
        ledger_rows += count
    if ledger_rows != expected.ledger_rows:
        problems.append(f"ledger rows {ledger_rows}, expected {expected.ledger_rows}")
    wrong = {
        sku: (stock[sku], expected.stock[sku])
        for sku in set(stock) | set(expected.stock)
        if stock[sku] != expected.stock[sku]
    }
    if wrong:
        problems.append(f"stock (held, expected) differs: {dict(sorted(wrong.items())[:5])}")
    orders = {
        order: (status, version)
        for order, status, version in conn.execute(
            "SELECT order_id, status, version FROM shop_orderstate"
        )
    }
    if orders != expected.orders:
        differ = [o for o in expected.orders if orders.get(o) != expected.orders[o]]
        problems.append(f"{len(differ)} order states differ, e.g. {differ[:3]}")
    return problems


def outbox(conn: psycopg.Connection, expected: Expected) -> list[str]:
    keys = dict(conn.execute("SELECT key, status FROM webhook_receiver_outboxmessage").fetchall())
    problems = []
    if set(keys) != set(expected.messages):
        problems.append(
            f"outbox holds {len(keys)} messages, expected {len(expected.messages)} "
            f"(missing {len(set(expected.messages) - set(keys))}, "
            f"extra {len(set(keys) - set(expected.messages))})"
        )
    undelivered = Counter(status for status in keys.values() if status != "delivered")
    if undelivered:
        problems.append(f"messages not delivered: {dict(undelivered)}")
    return problems


def attempt_starts(conn: psycopg.Connection) -> list[float]:
    """Every delivery attempt's start (epoch seconds), as the relay recorded it."""
    return sorted(
        row[0]
        for row in conn.execute(
            "SELECT extract(epoch FROM started_at)::float8 FROM webhook_receiver_deliveryattempt"
        )
    )


@dataclass
class Limits:
    rate: float  # starts a second
    burst: int
    concurrency: int


@dataclass
class Delivery:
    """The merchant's side of the relay, and the limits' figures."""

    arrivals: int = 0
    distinct: int = 0
    resent: int = 0
    most_in_flight: int = 0
    worst_1s_arrivals: int = 0
    worst_1s_starts: int = 0
    bucket_excess: float = 0.0
    per_second: float = 0.0
    problems: list[str] = field(default_factory=list)


def delivery(
    arrivals: Sequence[Arrival],
    most_in_flight: int,
    starts: Sequence[float],
    expected: Expected,
    limits: Limits,
) -> Delivery:
    d = Delivery(arrivals=len(arrivals), most_in_flight=most_in_flight)
    times = sorted(a.at for a in arrivals)
    per_key = Counter(a.key for a in arrivals)
    d.distinct = len(per_key)
    d.resent = sum(n - 1 for n in per_key.values())
    if len(times) > 1:
        # while there was something to send: a pause of more than ACTIVE_GAP seconds (the
        # leases of a lost round running out) is not the relay's pace
        active = sum(min(b - a, ACTIVE_GAP) for a, b in zip(times, times[1:], strict=False))
        d.per_second = (len(times) - 1) / active if active else 0.0
    missing = set(expected.messages) - set(per_key)
    if missing:
        d.problems.append(f"{len(missing)} messages never arrived, e.g. {sorted(missing)[:3]}")
    extra = set(per_key) - set(expected.messages)
    if extra:
        d.problems.append(f"{len(extra)} unexpected keys arrived, e.g. {sorted(extra)[:3]}")
    if most_in_flight > limits.concurrency:
        d.problems.append(
            f"{most_in_flight} requests in flight at once, above the limit {limits.concurrency}"
        )
    d.worst_1s_arrivals = worst_window(times, 1.0)
    if d.worst_1s_arrivals > limits.rate + limits.burst + ARRIVAL_SLACK:
        d.problems.append(
            f"{d.worst_1s_arrivals} arrivals in one second, above rate + burst "
            f"{limits.rate:g} + {limits.burst}"
        )
    d.worst_1s_starts = worst_window(starts, 1.0)
    d.bucket_excess = bucket_excess(starts, limits.rate, limits.burst)
    if d.bucket_excess > BUCKET_SLACK:
        d.problems.append(
            f"the relay's starts exceed rate·T + burst by {d.bucket_excess:.2f} in some window"
        )
    first: dict[str, float] = {}
    for a in sorted(arrivals, key=lambda a: a.at):
        first.setdefault(a.key, a.at)
    orders: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for key, ordering in expected.messages.items():
        if key in first:
            orders[ordering].append((int(key.rsplit(":v", 1)[1]), first[key]))
    out_of_order = [
        o
        for o, seen in orders.items()
        if [v for v, _ in sorted(seen, key=lambda s: s[1])] != sorted(v for v, _ in seen)
    ]
    if out_of_order:
        d.problems.append(f"{len(out_of_order)} orders' messages arrived out of order")
    return d
