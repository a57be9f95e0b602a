"""What the sender sends, decided before the run from a seed, and what it must leave.

A plan is a list of shop events (``project/shop/handlers.py``): per order a reservation
(version 1), then mostly a payment (2), then a fulfilment (3), or a cancellation with
the stock released (3). Each event is scheduled at an offset from the start of sending;
some are sent as several concurrent copies, some late (reordering), and a few are
shadowed by a tampered copy (the body changed, the original's signature) or by a stale
one (a fresh id, a valid signature, a timestamp an hour old). Tampered and stale
bodies name orders ``evil-…``, so any effect of theirs is visible.

The expected state is a function of the set of events applied: ledger sums per SKU
(minus reserved, plus released) and, per order, the status of its highest version.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

SKUS = [f"SKU-{n:02d}" for n in range(24)]
EVIL_PREFIX = "evil-"


@dataclass
class PlannedEvent:
    msg_id: str
    type: str
    order_id: str
    version: int
    lines: list[tuple[str, int]] = field(default_factory=list)
    at: float = 0.0  # seconds after sending starts
    copies: int = 1  # concurrent deliveries of the same event
    tamper: bool = False  # a tampered copy goes with it
    stale: bool = False  # a stale, validly signed request with a fresh id goes with it

    def payload(self, *, order_id: str | None = None, quantity_factor: int = 1) -> dict:
        data: dict = {"order_id": order_id or self.order_id, "version": self.version}
        if self.type.startswith("inventory."):
            data["lines"] = [{"sku": s, "quantity": q * quantity_factor} for s, q in self.lines]
        return {"type": self.type, "data": data}


def plan_build(events: int, duration: float, seed: int, run_id: str) -> list[PlannedEvent]:
    """``events`` events spread over ``duration`` seconds (exactly that many real ones)."""
    rng = random.Random(seed)
    planned: list[PlannedEvent] = []
    order = 0
    while len(planned) < events:
        order += 1
        order_id = f"ord-{run_id}-{order}"
        lines = [(sku, rng.randint(1, 5)) for sku in rng.sample(SKUS, rng.randint(1, 3))]
        chain = [PlannedEvent("", "inventory.reserved", order_id, 1, lines)]
        if rng.random() < 0.9:
            chain.append(PlannedEvent("", "order.paid", order_id, 2))
            roll = rng.random()
            if roll < 0.6:
                chain.append(PlannedEvent("", "order.fulfilled", order_id, 3))
            elif roll < 0.9:
                chain.append(PlannedEvent("", "order.cancelled", order_id, 3))
                chain.append(PlannedEvent("", "inventory.released", order_id, 3, lines))
        planned.extend(chain)
    planned = planned[:events]
    step = duration / max(events, 1)
    for index, event in enumerate(planned):
        event.msg_id = f"msg_{run_id}_{index}"
        # neighbours swap places now and then; one in ten comes seconds late
        event.at = index * step + rng.uniform(0, 20 * step)
        if rng.random() < 0.1:
            event.at += rng.uniform(0.5, 3.0)
        roll = rng.random()
        event.copies = 3 if roll < 0.04 else 2 if roll < 0.14 else 1
        event.tamper = rng.random() < 0.01
        event.stale = rng.random() < 0.01
    planned.sort(key=lambda e: e.at)
    return planned


def plan_save(planned: list[PlannedEvent], path: Path) -> None:
    path.write_text(json.dumps([asdict(e) for e in planned]))


def plan_load(path: Path) -> list[PlannedEvent]:
    events = []
    for row in json.loads(path.read_text()):
        row["lines"] = [tuple(line) for line in row["lines"]]
        events.append(PlannedEvent(**row))
    return events


def expected_state(
    planned: list[PlannedEvent], excluded: set[str] = frozenset()
) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    """Ledger sums per SKU and (status, version) per order once every event but the
    ``excluded`` message ids (dead letters) has been applied, in any order."""
    sums: dict[str, int] = defaultdict(int)
    orders: dict[str, tuple[str, int]] = {}
    status_of = {"order.paid": "paid", "order.cancelled": "cancelled"}
    status_of["order.fulfilled"] = "fulfilled"
    for event in planned:
        if event.msg_id in excluded:
            continue
        if event.type.startswith("inventory."):
            sign = -1 if event.type == "inventory.reserved" else 1
            for sku, quantity in event.lines:
                sums[sku] += sign * quantity
        else:
            current = orders.get(event.order_id)
            if current is None or current[1] < event.version:
                orders[event.order_id] = (status_of[event.type], event.version)
    return dict(sums), orders
