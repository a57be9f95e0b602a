"""The same scenario and seed print the same report, to the byte, on every database and
machine: the report of tests/evaluation/data/mixed.yaml (every kind of fault, a crash,
the receiver's side) is kept in mixed.txt, and both test runs (PostgreSQL and SQLite)
must produce exactly it. When a deliberate change to the policy moves a figure, the
file is written again (see docs/eval.md) and the diff shows what moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook_receiver.evaluation import report, scenario
from webhook_receiver.evaluation.run import evaluate_all

pytestmark = pytest.mark.django_db(transaction=True)

DATA = Path(__file__).resolve().parent / "data"


def test_the_mixed_scenario_prints_the_kept_report_to_the_byte():
    export = evaluate_all([scenario.load(str(DATA / "mixed.yaml"))], seed=7)

    assert report.body_text(export) == (DATA / "mixed.txt").read_text()


def test_a_run_repeated_in_one_process_is_the_same_and_another_seed_is_not():
    small = scenario.parse(
        {
            "name": "small",
            "duration": "5m",
            "destinations": [
                {"name": "shop", "rate": "1/s", "faults": [{"status": 500, "share": 0.5}]}
            ],
            "admissions": [{"orders": 20, "over": "10s"}],
        }
    )
    first = evaluate_all([small], seed=1)
    again = evaluate_all([small], seed=1)
    other = evaluate_all([small], seed=2)

    assert report.body_text(first) == report.body_text(again)
    assert (
        first["scenarios"][0]["metrics"]["destinations"]
        == (again["scenarios"][0]["metrics"]["destinations"])
    )
    # the seed decides which keys fail and how long each backoff is
    assert report.body_text(first) != report.body_text(other)
