"""The traffic a scenario asks for, as scheduled happenings: the orders whose events
are admitted to the outbox (and admitted again, as ``repeat`` says), and a sender's
signed events posted to this app (late, redelivered, silent as ``inbound`` says). Every
choice is a hash of the seed and the key (``world.chance``): the same on every run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..outbound.admission import message_key
from .inputs import Scenario
from .world import Receiver, chance

Happening = tuple[float, str, dict[str, Any]]


def admissions(scenario: Scenario, seed: int) -> Iterator[Happening]:
    """Each order's events, to their destinations, at their times (and the repeats)."""
    for a in scenario.admissions:
        targets = a.destinations or scenario.names()
        step = a.over / a.orders
        for n in range(a.orders):
            order_id = f"{a.prefix}_{n + 1:05d}"
            first = a.start + n * step
            for i, event in enumerate(a.events):
                at = round(first + i * a.gap, 6)
                key = message_key("order", order_id, event, 1)
                item = {
                    "key": key,
                    "event": event,
                    "order_id": order_id,
                    "ordering_key": f"order:{order_id}" if a.ordering else None,
                    "targets": targets,
                    "metadata": a.metadata,
                }
                yield at, "admit", item
                for r, repeat in enumerate(a.repeats):
                    if chance(seed, "repeat", r, key) < repeat.share:
                        yield round(at + repeat.after, 6), "admit", item | {"repeat": True}


def inbound(scenario: Scenario, seed: int, receiver: Receiver) -> Iterator[Happening]:
    """The sender's posts: each event once (late for a share), again for a share, none
    in a silent window; the receiver learns which events fail after their effect."""
    spec = scenario.inbound
    if spec is None:
        return
    step = spec.over / spec.events
    n = 0
    for i in range(spec.events):
        at = i * step
        if any(w.holds(at) for w in spec.silent):
            continue
        n += 1
        key = f"evt_{n:05d}"
        if chance(seed, "fail", key) < spec.fail_after_effect:
            receiver.fail_first.add(key)
        if chance(seed, "late", key) < spec.late.share:
            at += spec.late.by * chance(seed, "late-by", key)
        yield round(at, 6), "inbound", {"key": key, "first": True}
        if chance(seed, "dup", key) < spec.duplicates.share:
            yield round(at + spec.duplicates.after, 6), "inbound", {"key": key}
