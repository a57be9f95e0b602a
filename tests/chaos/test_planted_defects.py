"""Checks that cannot fail prove nothing: each test plants one defect in a recorded chaos
run (``recorded.py``: what a correct run of a small plan leaves in the database, the
merchant's book and the sender's record) and shows that the end-of-run checks fail on it:
the check that guards against that defect, with its detail naming the offending event or
key; while the same record without the defect passes every check."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.chaos.checks import (
    AUDIT,
    HOSTILE,
    INBOUND_ONCE,
    ISOLATION,
    OUTBOUND_ONCE,
    SAMPLE,
    STATE,
)
from tests.chaos.plan import PlannedEvent
from tests.chaos.recorded import RecordedRun, recorded_run


@pytest.fixture
def run() -> RecordedRun:
    return recorded_run()


def test_the_recorded_run_passes_every_check(run: RecordedRun) -> None:
    results = run.checks()

    names = [INBOUND_ONCE, HOSTILE, STATE, OUTBOUND_ONCE, AUDIT, ISOLATION]
    assert [c.name for c in results] == names
    assert run.failed() == {}
    # what the defects below are planted on is there, and passes as it is
    figures = {c.name: c.figures for c in results}
    assert figures[INBOUND_ONCE]["failed_events"] == {"resolved": 1, "dead": 1}
    assert figures[OUTBOUND_ONCE]["answers"]["500"] == 1
    assert _duplicated_stock_events(run)
    assert _orders_with_two_messages(run)
    assert len(run.admitted_beside_the_neighbours()) >= 3


def test_a_duplicate_that_applies_its_effect_again_is_a_double_effect(run: RecordedRun) -> None:
    event = _duplicated_stock_events(run)[0]
    _apply_again(run, event)

    failed = run.failed()

    assert set(failed) == {INBOUND_ONCE, STATE}
    lines = len(event.lines)
    expected = f"DOUBLE EFFECT 1: {event.msg_id} ({2 * lines} ledger rows, {lines} lines)"
    assert expected in failed[INBOUND_ONCE]
    assert f"SKUS {min(sku for sku, _ in event.lines)} want" in failed[STATE]


def test_a_claim_that_ignores_whether_its_insert_won_is_a_double_effect(run: RecordedRun) -> None:
    """The defect found by hand: every request for a key already taken runs the handler
    again. A stock movement is applied once per request; an order move finds its version
    already there and changes nothing (the version guard), so it leaves no trace."""
    rows = run.requests.rows
    taken = Counter(row[0] for row in rows if row[1] == "real" and row[6] in (200, 202))
    doubled = []
    for event in run.planned:
        if event.msg_id in run.state["ledger_rows"] and taken[event.msg_id] > 1:
            doubled.append(event.msg_id)
            for _ in range(taken[event.msg_id] - 1):
                _apply_again(run, event)

    failed = run.failed()

    assert set(failed) == {INBOUND_ONCE, STATE}
    assert f"DOUBLE EFFECT {len(doubled)}: " in failed[INBOUND_ONCE]
    for key in sorted(doubled)[:SAMPLE]:
        assert f"{key} (" in failed[INBOUND_ONCE]


def test_a_message_missing_from_the_outbox_is_a_move_without_one(run: RecordedRun) -> None:
    # an order's first move, its second delivered: nothing else gives the loss away
    key = run.messages_of(_orders_with_two_messages(run)[0])[0]
    origin = run.state["outbox"].pop(key)[1]
    _never_reached_the_merchant(run, key)

    failed = run.failed()

    assert set(failed) == {OUTBOUND_ONCE}
    assert f"MOVE WITHOUT ONE MESSAGE 1: {origin}" in failed[OUTBOUND_ONCE]


def test_a_message_never_delivered_is_still_open(run: RecordedRun) -> None:
    order = _orders_with_two_messages(run)[0]
    key = run.messages_of(order)[-1]
    _, origin, _, attempts = run.state["outbox"][key]
    run.state["outbox"][key] = ("pending", origin, "", attempts)
    _never_reached_the_merchant(run, key)

    failed = run.failed()

    assert set(failed) == {OUTBOUND_ONCE}
    assert f"STILL OPEN 1: {key}" in failed[OUTBOUND_ONCE]
    assert f"MERCHANT BEHIND THE STATE 1: {order}" in failed[OUTBOUND_ONCE]


def test_an_orders_moves_reaching_the_merchant_out_of_version_order(run: RecordedRun) -> None:
    order = _orders_with_two_messages(run)[0]
    older, newer = run.messages_of(order)
    book = run.book.order
    i, j = book.index(older), book.index(newer)
    book[i], book[j] = newer, older

    failed = run.failed()

    assert set(failed) == {OUTBOUND_ONCE}
    versions = [run.book.effects[k].version for k in (newer, older)]
    expected = f"OUT OF ORDER 1: {order} (arrived v{versions[0]}, v{versions[1]})"
    assert expected in failed[OUTBOUND_ONCE]


def test_a_move_delivered_past_its_orders_failed_one_is_out_of_order(run: RecordedRun) -> None:
    """The merchant's arrival order cannot show this one: the older move never arrives.
    A failed message holds its ordering key, so the newer move must wait for an operator."""
    order = _orders_with_two_messages(run)[0]
    older, newer = run.messages_of(order)
    _, origin, _, attempts = run.state["outbox"][older]
    run.state["outbox"][older] = ("failed", origin, "401 bad signature", attempts)
    _never_reached_the_merchant(run, older)
    run.book.answers["401"] += 1

    failed = run.failed()

    assert set(failed) == {OUTBOUND_ONCE}
    versions = [run.book.effects[newer].version, run.event(origin).version]
    expected = f"OUT OF ORDER 1: {order} (v{versions[0]} delivered past v{versions[1]}, failed)"
    assert expected in failed[OUTBOUND_ONCE]


def test_a_dead_letter_that_vanished_is_an_event_not_applied(run: RecordedRun) -> None:
    key = run.dead_letter.msg_id
    del run.state["failed"][key]

    failed = run.failed()

    # neither applied nor held: its lines are now owed to the ledger as well
    assert set(failed) == {INBOUND_ONCE, STATE}
    expected = f"NOT APPLIED 1: {key} (no receipt nor failed event, though answered 202 deferred)"
    assert expected in failed[INBOUND_ONCE]


def test_a_500_counted_as_delivered_is_delivered_without_effect(run: RecordedRun) -> None:
    """The defect found by hand: the merchant answered 500 before doing anything, and the
    relay recorded the message delivered at that first attempt."""
    key = run.answered_500
    _, origin, _, _ = run.state["outbox"][key]
    run.state["outbox"][key] = ("delivered", origin, "", 1)
    _never_reached_the_merchant(run, key)
    run.book.deliveries[key] = 1  # the 500's request: the merchant saw it

    failed = run.failed()

    assert set(failed) == {OUTBOUND_ONCE}
    assert f"DELIVERED WITHOUT EFFECT 1: {key}" in failed[OUTBOUND_ONCE]


def test_the_merchant_as_fast_beside_its_neighbours_as_alone_holds(run: RecordedRun) -> None:
    isolation = next(c for c in run.checks() if c.name == ISOLATION)

    assert isolation.ok
    beside = len(run.admitted_beside_the_neighbours())
    assert isolation.detail.startswith(
        f"merchant p99 0.10 s admitted beside the neighbours ({beside} messages, max 0.10 s) "
        "against 0.10 s before the first fault"
    )
    assert "bound max(2 x 0.10 s, 0.10 s + 1 s) = 1.10 s; (6 bad destinations)" in isolation.detail
    # the neighbours' own messages, still pending or failed, fail nothing: counted apart
    outbound = next(c for c in run.checks() if c.name == OUTBOUND_ONCE)
    assert "other destinations' messages, not held to this: {'neighbour-0'" in outbound.detail


def test_a_merchant_held_40_s_by_its_neighbours_is_over_the_bound(run: RecordedRun) -> None:
    """The defect the lanes removed: the relay run in the worker's processes, held by the
    neighbours that never answer, and the merchant's messages waiting behind them."""
    held = run.admitted_beside_the_neighbours()
    for key in held:
        run.book.arrivals[key] = run.state["admitted"][key] + 40.0

    failed = run.failed()

    assert set(failed) == {ISOLATION}
    assert failed[ISOLATION].startswith(
        f"merchant p99 40.00 s admitted beside the neighbours ({len(held)} messages, max "
        "40.00 s) against 0.10 s before the first fault"
    )
    assert (
        "bound max(2 x 0.10 s, 0.10 s + 1 s) = 1.10 s; OVER THE BOUND by 38.90 s"
        in (failed[ISOLATION])
    )


# --- what the defects do to the record ---------------------------------------------


def _duplicated_stock_events(run: RecordedRun) -> list[PlannedEvent]:
    return [e for e in run.planned if e.type.startswith("inventory.") and e.copies > 1]


def _orders_with_two_messages(run: RecordedRun) -> list[str]:
    per_order = Counter(effect.order_id for effect in run.book.effects.values())
    return sorted(order for order, n in per_order.items() if n == 2)


def _apply_again(run: RecordedRun, event: PlannedEvent) -> None:
    """One more set of the event's ledger rows."""
    sign = -1 if event.type == "inventory.reserved" else 1
    run.state["ledger_rows"][event.msg_id] += len(event.lines)
    for sku, quantity in event.lines:
        run.state["ledger_sums"][sku] += sign * quantity


def _never_reached_the_merchant(run: RecordedRun, key: str) -> None:
    """The merchant has no effect of the message's."""
    book = run.book
    del book.effects[key]
    book.order.remove(key)
    book.answers["applied"] -= 1
    book.deliveries[key] = 0
