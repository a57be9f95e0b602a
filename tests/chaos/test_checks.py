"""The chaos run's own arithmetic, without servers: the plan and the state it must leave,
and the audit check's verdicts on requests the sender recorded (``make chaos-short`` is
the run itself)."""

from __future__ import annotations

import random

from tests.chaos.checks import Requests, audit_check
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
