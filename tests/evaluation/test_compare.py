"""--compare holds a run's statements a delivery to the saved run's on the same database:
statement counts are as deterministic as the simulated figures, so one statement more
a round is a regression, even in a backlog of rounds of ten (+0.1 a delivery)."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.support.paths import REPO
from webhook_receiver.evaluation import report

BASELINE = REPO / "deploy" / "eval" / "baseline.json"


def saved() -> dict[str, Any]:
    return json.loads(BASELINE.read_text())


def with_statements(export: dict[str, Any], more: float) -> dict[str, Any]:
    """The export with ``more`` statements a delivery in every scenario that delivers."""
    changed = copy.deepcopy(export)
    for s in changed["scenarios"]:
        e = s["metrics"]["engine_dependent"]
        if e["statements_per_delivery"] is not None:
            e["statements_per_delivery"] = round(e["statements_per_delivery"] + more, 2)
    return changed


def delivering(export: dict[str, Any]) -> list[str]:
    return [
        s["name"]
        for s in export["scenarios"]
        if s["metrics"]["engine_dependent"]["statements_per_delivery"] is not None
    ]


def test_one_statement_more_every_ten_deliveries_is_a_regression_in_each_scenario():
    baseline = saved()

    regressions, _ = report.compare(with_statements(baseline, 0.1), baseline)

    assert [r.split(":")[0] for r in regressions] == delivering(baseline)
    assert all("statements_per_delivery" in r and "beyond the tolerance" in r for r in regressions)


def test_the_same_statements_or_fewer_are_no_regression():
    baseline = saved()

    same, _ = report.compare(copy.deepcopy(baseline), baseline)
    fewer, changes = report.compare(with_statements(baseline, -0.5), baseline)

    assert same == [] and fewer == []
    assert len([c for c in changes if "statements_per_delivery" in c]) == len(delivering(baseline))


def test_statements_on_another_database_are_not_compared():
    baseline = saved()
    elsewhere = with_statements(baseline, 3.0)
    elsewhere["database"] = "sqlite" if baseline["database"] != "sqlite" else "postgresql"

    regressions, changes = report.compare(elsewhere, baseline)

    assert regressions == []
    assert not [c for c in changes if "statements_per_delivery" in c]
