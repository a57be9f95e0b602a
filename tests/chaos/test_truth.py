"""The truth table of a chaos run from recorded probes, without servers: when health and
status first said a fault, when they said it was over, and whether they said OK during
it (``truth.py``; the probes are ``watcher.py``'s, the windows ``faults.py``'s)."""

from __future__ import annotations

from tests.chaos.checks import passed
from tests.chaos.faults import BROKER, FROZEN, Window
from tests.chaos.truth import TRUTHFUL, truth_check, truth_table
from tests.chaos.watcher import HEALTH, STATUS, Probe

ANSWER = 0.5  # seconds each probe takes to answer


def _probes(kind: str, every: float, until: float, wrong=(), unanswered=(),
            reason: tuple[str, ...] = ("Broker",)) -> list[Probe]:  # fmt: skip
    """A probe asked every ``every`` s from 0 to ``until``: "wrong" (for ``reason``) when
    asked within a span of ``wrong``, no answer within one of ``unanswered``, else OK."""
    probes, t = [], 0.0
    while t < until:
        if any(a <= t < b for a, b in unanswered):
            probes.append(Probe(kind, t, t + 5.0, None, "no answer within 5 s"))
        elif any(a <= t < b for a, b in wrong):
            probes.append(Probe(kind, t, t + ANSWER, False, f"{kind} wrong at {t:g}", reason))
        else:
            probes.append(Probe(kind, t, t + ANSWER, True, "200"))
        t += every
    return probes


# a frozen worker from 100 to 160 s, a broker outage from 200 to 380 s, then a snapshot
WINDOWS = [
    Window(FROZEN, 100.0, 160.0),
    Window(BROKER, 200.0, 380.0),
    Window("snapshot", 400.0, 410.0),
]


def test_a_probe_that_says_each_fault_in_time_and_no_ok_within_it_is_true() -> None:
    # health: wrong from 110 to 162 and 200 to 390; status: 130 to 170 and 250 to 395
    health = _probes(HEALTH, 2, 450, wrong=[(110, 162), (200, 390)])
    status = _probes(STATUS, 3, 450, wrong=[(130, 170), (250, 395)])

    table = truth_table(status + health, WINDOWS)

    frozen, broker, snapshot = table
    assert (frozen["fault"], frozen["began"], frozen["ended"]) == (FROZEN, 100.0, 160.0)
    assert frozen[HEALTH] == {
        "before": "ok",
        "before_reasons": [],
        "first_wrong_s": 10.5,  # the probe asked at 110 s, answered at 110.5 s
        "first_wrong_said": "health wrong at 110",
        "ok_again_s": 2.5,  # asked at 162 s
        "ok_during": 0,
        "answers": {"ok": 5, "wrong": 25, "none": 0},
        "unanswered": 0,
        "held": True,
    }
    assert (frozen[STATUS]["first_wrong_s"], frozen[STATUS]["ok_again_s"]) == (32.5, 11.5)
    assert (broker[HEALTH]["first_wrong_s"], broker[HEALTH]["ok_again_s"]) == (0.5, 10.5)
    assert (broker[STATUS]["first_wrong_s"], broker[STATUS]["ok_again_s"]) == (52.5, 16.5)
    # the snapshot: neither said it, and neither is held to it
    assert snapshot[HEALTH]["before"] == snapshot[STATUS]["before"] == "ok"
    assert snapshot[HEALTH]["first_wrong_s"] is snapshot[STATUS]["first_wrong_s"] is None
    assert not snapshot[HEALTH]["held"] and not snapshot[STATUS]["held"]

    check = truth_check(table, required=True)
    assert check.name == TRUTHFUL
    assert check.ok, check.detail
    assert check.detail == "3 faults, 4 (fault, probe) pairs held; all true"


def test_status_ok_through_an_outage_and_health_flapping_are_wrong_cells() -> None:
    # health wrong through the outage but OK again at 300 to 310 s; status never wrong
    health = _probes(HEALTH, 2, 450, wrong=[(110, 160), (200, 300), (310, 380)])
    status = _probes(STATUS, 3, 450)

    table = truth_table(health + status, WINDOWS)
    broker = table[1]

    assert broker[STATUS]["first_wrong_s"] is None
    assert broker[STATUS]["ok_again_s"] is None
    # OK answers from 60 s into the outage (its time to notice) to its end
    assert broker[STATUS]["ok_during"] == 40
    assert broker[HEALTH]["ok_during"] == 5  # asked at 300, 302, ... 308 s
    assert broker[HEALTH]["ok_again_s"] == 0.5  # after its last wrong answer, at 378 s
    check = truth_check(table, required=True)
    assert not check.ok
    assert f"{BROKER} {STATUS}: never said wrong" in check.detail
    assert f"{BROKER} {HEALTH}: said OK 5 times during the fault" in check.detail
    assert f"{FROZEN} {STATUS}: never said wrong" in check.detail


def test_late_answers_a_wrong_that_outlasts_the_gap_and_unanswered_probes() -> None:
    # health: wrong from 170 s only (70 s into the freeze) and until past the next fault;
    # status: no answer within bound at 100 to 130 s, then wrong to 180 s
    health = _probes(HEALTH, 2, 450, wrong=[(170, 205)])
    status = _probes(STATUS, 3, 450, wrong=[(130, 180)], unanswered=[(100, 130)])
    windows = [Window(FROZEN, 100.0, 160.0), Window(BROKER, 200.0, 210.0)]

    frozen = truth_table(health + status, windows)[0]

    assert frozen[HEALTH]["first_wrong_s"] == 70.5
    # OK at 206 s: its "Broker" answers from 200 s are read as this fault's, still said
    assert frozen[HEALTH]["ok_again_s"] == 46.5
    assert frozen[HEALTH]["ok_during"] == 0  # (OK until 160 s, within its minute)
    assert frozen[STATUS]["unanswered"] == 10
    assert frozen[STATUS]["answers"] == {"ok": 0, "wrong": 10, "none": 10}
    # a probe with no answer said nothing: neither wrong nor OK
    assert frozen[STATUS]["first_wrong_s"] == 32.5  # asked at 132 s
    check = truth_check(truth_table(health + status, windows), required=True)
    assert f"{FROZEN} {HEALTH}: said wrong only after 70.5 s" in check.detail
    assert f"{FROZEN} {STATUS}: 10 probes unanswered within bound" in check.detail


def test_unless_required_a_wrong_cell_is_pending_and_the_run_passes() -> None:
    table = truth_table(_probes(HEALTH, 2, 450) + _probes(STATUS, 3, 450), WINDOWS)

    check = truth_check(table, required=False)

    assert not check.ok
    assert not check.required
    assert check.detail.endswith("(report-only: --require-truthful-status makes it fail the run)")
    assert passed([check])
    assert not passed([truth_check(table, required=True)])


def test_a_reason_said_before_the_fault_neither_notices_it_nor_keeps_it_open() -> None:
    # status names not_stored from 0 s on (a condition of the last hour, from an earlier
    # fault), and relay_not_sending beside it from 130 to 170 s only
    old, new = ("source:not_stored",), ("destination:relay_not_sending", "source:not_stored")
    status = [p for p in _probes(STATUS, 3, 450, wrong=[(0, 450)], reason=old)
              if not 130 <= p.start < 170]  # fmt: skip
    status += _probes(STATUS, 3, 450, wrong=[(130, 170)], reason=new)
    status = [p for p in status if p.ok is False]  # (both lists cover every instant)
    status.sort(key=lambda p: p.start)
    health = _probes(HEALTH, 2, 450)

    frozen, broker, _ = truth_table(status + health, WINDOWS)

    assert frozen[STATUS]["before"] == "wrong"
    assert frozen[STATUS]["before_reasons"] == ["source:not_stored"]
    assert frozen[STATUS]["first_wrong_s"] == 32.5  # relay_not_sending, asked at 132 s
    assert frozen[STATUS]["ok_again_s"] == 11.5  # not_stored alone again, at 171 s
    assert frozen[STATUS]["ok_during"] == 0
    # the outage: not_stored alone all along, which it said before: never noticed
    assert broker[STATUS]["first_wrong_s"] is None
    assert broker[STATUS]["ok_during"] == 40
