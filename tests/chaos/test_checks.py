"""The chaos run's own arithmetic, without servers: the plan and the state it must leave,
the audit check's verdicts on requests the sender recorded, and the isolation check's
bound on the merchant's latency beside noisy neighbours (``make chaos-short`` is the run
itself)."""

from __future__ import annotations

import random

import pytest

from tests.chaos.checks import Requests, audit_check, isolation_check
from tests.chaos.faults import NOISY, Window
from tests.chaos.merchant import MerchantBook
from tests.chaos.plan import expected_state, plan_build


def test_the_plan_has_its_events_and_the_expected_state_ignores_their_order():
    planned = plan_build(500, 10.0, seed=3, run_id="t")
    assert len(planned) == 500
    assert len({e.msg_id for e in planned}) == 500
    assert [e.at for e in planned] == sorted(e.at for e in planned)
    shuffled = planned[:]
    random.Random(1).shuffle(shuffled)
    assert expected_state(shuffled) == expected_state(planned)
    # a dead letter's effect is left out, and only its own
    reserved = next(e for e in planned if e.type == "inventory.reserved")
    sums, _ = expected_state(planned, excluded={reserved.msg_id})
    sku, quantity = reserved.lines[0]
    assert sums[sku] == expected_state(planned)[0][sku] + quantity


def _state(audits, tallies=()):
    return {"audits": audits, "tallies": list(tallies)}


def test_the_audit_check_holds_records_to_the_answers():
    row = ["m1", "real", 0, 1, 10.0, 10.1]
    answered = Requests([row + [200, "applied", ""]], [], 0)
    verified = ("m1", "verified", 200, "applied", None)
    assert audit_check(answered, _state([verified]), []).ok
    assert not audit_check(answered, _state([]), []).ok  # an answered request unrecorded
    # a request without an answer may or may not have reached the app
    lost = Requests([row + [None, "", "no_answer:RemoteDisconnected"]], [], 0)
    assert audit_check(lost, _state([verified]), []).ok
    assert audit_check(lost, _state([]), []).ok
    # one that found no connection never did
    refused = Requests([row + [None, "", "refused:ConnectionRefusedError"]], [], 0)
    assert not audit_check(refused, _state([verified]), []).ok


def test_the_audit_check_excuses_refusals_only_while_the_database_was_down():
    rows = [["x", "tamper", 0, 1, t, t + 0.01, 401, "invalid_signature", ""] for t in (5, 50)]
    requests = Requests(rows, [], 0)
    record = ("x", "invalid_signature", 401, "invalid_signature", None)
    tallies = [("invalid_signature", 1, 0)]
    assert audit_check(requests, _state([record], tallies), [(40.0, 60.0)]).ok
    assert not audit_check(requests, _state([record], tallies), []).ok


def test_the_audit_check_excuses_no_verified_record_lost_to_a_crash():
    """Every claim commits durably, a duplicate's too: a record missing for a request
    answered 2xx is a fault, whether or not a crash followed."""
    first = ["m1", "real", 0, 1, 9.9, 9.91, 200, "applied", ""]
    again = ["m1", "real", 1, 1, 9.9, 9.92, 200, "duplicate", ""]
    requests = Requests([first, again], [], 0)
    one_record = [("m1", "verified", 200, "applied", None)]
    both = one_record + [("m1", "verified", 200, "duplicate", None)]
    crash = [(9.0, 15.0)]  # from RELAXED_COMMIT_SECONDS before the stop
    assert audit_check(requests, _state(both), crash).ok
    assert not audit_check(requests, _state(one_record), crash).ok
    assert not audit_check(requests, _state(one_record), []).ok


def _latencies(calm: list[float], beside: list[float]) -> tuple[dict, MerchantBook]:
    """The merchant's messages: ``calm`` admitted at 0 to 99 s, ``beside`` at 100 s on
    (the neighbours' hold: 100 to 200 s), each arriving that many seconds later (``None``:
    never)."""
    state: dict = {"admitted": {}}
    book = MerchantBook()
    for n, latency in enumerate(calm + beside):
        key, at = f"m{n}", float(n if n < len(calm) else 100 + n - len(calm))
        state["admitted"][key] = at
        if latency is not None:
            book.arrivals[key] = at + latency
    return state, book


NEIGHBOURS = [Window(NOISY, 99.5, 210.0, "(6 bad destinations)", hold=(100.0, 200.0))]


@pytest.mark.parametrize(
    ("calm", "beside", "ok"),
    [
        (0.2, 1.2, True),  # a fast merchant: a second more than alone
        (0.2, 1.3, False),
        (3.0, 6.0, True),  # a slow one: twice
        (3.0, 6.1, False),
        (0.2, 0.1, True),
    ],
)
def test_the_merchants_p99_beside_its_neighbours_is_held_to_twice_or_a_second_more(
    calm: float, beside: float, ok: bool
) -> None:
    # a hundred messages either side: the p99 is the highest but one
    state, book = _latencies([0.05] * 98 + [calm] * 2, [0.05] * 98 + [beside] * 2)

    check = isolation_check(state, book, NEIGHBOURS)

    assert check.ok is ok
    assert (check.figures["calm"]["p99_s"], check.figures["beside"]["p99_s"]) == (calm, beside)
    assert check.figures["bound_s"] == round(max(2 * calm, calm + 1), 3)
    assert ("OVER THE BOUND" in check.detail) is not ok


def test_a_slow_message_of_another_faults_window_does_not_loosen_the_bound() -> None:
    state, book = _latencies([0.1] * 100, [2.0] * 100)
    for at in (48.5, 50.5, 52.5):  # admitted during a lock, delivered after it
        state["admitted"][f"late-{at}"], book.arrivals[f"late-{at}"] = at, 60.0
    lock = Window("lock_outbox", 45.0, 55.0)

    # were they calm, the merchant's p99 alone would be 9.5 s, and 2 s beside within it
    assert isolation_check(state, book, NEIGHBOURS).figures["calm"]["p99_s"] == 9.5
    check = isolation_check(state, book, [lock, *NEIGHBOURS])

    assert not check.ok
    # (the calm ones are those admitted before the lock, at 0 to 44 s)
    assert check.figures["calm"] == {"messages": 45, "p50_s": 0.1, "p99_s": 0.1,
                                     "max_s": 0.1, "never_arrived": 0}  # fmt: skip
    assert "bound max(2 x 0.10 s, 0.10 s + 1 s) = 1.10 s; OVER THE BOUND by 0.90 s" in (
        check.detail
    )


def test_a_message_that_never_arrived_counts_as_never() -> None:
    state, book = _latencies([0.1] * 100, [0.1] * 98 + [None] * 2)

    check = isolation_check(state, book, NEIGHBOURS)

    assert not check.ok
    assert "merchant p99 never admitted beside the neighbours" in check.detail
    assert "2 never arrived" in check.detail


def test_without_the_neighbours_hold_nothing_is_measured_and_the_check_fails() -> None:
    state, book = _latencies([0.1] * 100, [0.1] * 100)
    unheld = [Window(NOISY, 99.5, 210.0, "(the add failed)")]

    for windows in ([], unheld):
        check = isolation_check(state, book, windows)
        assert not check.ok
        assert check.detail == "no noisy-neighbours window held: nothing measured"


def test_a_429_the_merchant_answered_in_the_hold_adds_the_wait_it_asked_for() -> None:
    # the message behind a deferred one in its order waits the merchant's Retry-After
    state, book = _latencies([0.04] * 100, [0.04] * 98 + [1.06] * 2)
    assert not isolation_check(state, book, NEIGHBOURS).ok
    start, _ = NEIGHBOURS[0].hold
    book.deferred_at.append(start + 1.0)

    check = isolation_check(state, book, NEIGHBOURS)

    assert check.ok
    assert check.figures["bound_s"] == 2.04
    assert "+ 1 s the merchant asked for (429 answered 1 x in the hold) = 2.04 s" in check.detail
