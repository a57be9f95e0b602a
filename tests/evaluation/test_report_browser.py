"""The evaluation's HTML report (``webhook_eval --html``) as a person opens it: a file in
headless Chromium at 1400 px, made from real runs of the harness, one where every
invariant held and one where a defect (a limiter that overspends) broke one.

The verdict comes first (a red box naming the broken invariant, or a green banner),
each scenario draws its four charts with data in them (five when messages were held
back), the texts taken from the scenario file are shown as text and never run, and the
page fetches nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import WINDOW, no_sideways_scroll, screenshot
from tests.support.defects import limiter_overspends
from webhook_receiver.evaluation import scenario
from webhook_receiver.evaluation.html import html_report
from webhook_receiver.evaluation.run import evaluate_all

# a description as a careless (or hostile) scenario file could hold: shown, never run
DESCRIPTION = 'two merchants <script>document.title = "ran"</script> & one 500 a third'
CHARTS_PER_SCENARIO = 4


@pytest.fixture(autouse=True)
def _quiet_app_logs(caplog):
    """The simulated relay logs a line per answer; the test reads none of them."""
    caplog.set_level("CRITICAL", logger="webhook_receiver")


def tiny(*, tight: bool) -> scenario.Scenario:
    """Two destinations, 40 orders over 20 s, a 500 on the first attempt of a third of
    the keys, 5 minutes; ``tight``: the second destination may send 1 a second, burst 1."""
    fault = {"status": 500, "attempts": [1], "share": 0.3}
    return scenario.parse(
        {
            "name": "tiny",
            "description": DESCRIPTION,
            "duration": "5m",
            "destinations": [
                {"name": "fast", "rate": "5/s", "burst": 5, "faults": [fault]},
                {
                    "name": "slow",
                    "rate": "1/s" if tight else "2/s",
                    "burst": 1 if tight else 2,
                    "max_in_flight": 1,
                    "faults": [fault],
                },
            ],
            "admissions": [{"orders": 40, "over": "20s"}],
        }
    )


def open_report(browser: Any, export: dict[str, Any], tmp_path: Path) -> str:
    """Write the export's report to a file and open it as a person would: file://."""
    path = tmp_path / "report.html"
    path.write_text(html_report(export), encoding="utf-8")
    browser.get(path.as_uri())
    return path.read_text(encoding="utf-8")


def nothing_fetched(browser: Any, page: str) -> None:
    """No reference to anything outside the file, in its source or in what the browser
    loaded, and no script at all (the description's <script> is text)."""
    assert not re.search(r"https?://", page), re.search(r".{60}https?://.{60}", page)
    for pattern in (r"<link\b", r"<script\b", r"@import", r"url\(", r"\bsrc\s*="):
        assert not re.search(pattern, page, re.IGNORECASE), pattern
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert browser.execute_script("return document.querySelectorAll('script, link').length") == 0


def charts_drawn(browser: Any, export: dict[str, Any]) -> None:
    """Four charts per scenario, each with a legend entry per destination and at least
    one shape of data with an area on screen (not an empty box)."""
    from selenium.webdriver.common.by import By

    destinations = len(export["scenarios"][0]["destinations"])
    for i in range(len(export["scenarios"])):
        charts = browser.find_elements(By.CSS_SELECTOR, f"#scenario-{i} svg.chart")
        assert len(charts) == CHARTS_PER_SCENARIO
        assert all(c.is_displayed() and c.size["height"] > 150 for c in charts)
        drawn = browser.execute_script(
            """return [...document.querySelectorAll(arguments[0])].map(svg => ({
                 shapes: [...svg.querySelectorAll('.data')].filter(e => {
                   const b = e.getBBox(); return b.width > 1 && b.height > 1; }).length,
                 legend: svg.querySelectorAll('.legend').length,
                 empty: svg.querySelectorAll('.empty').length }))""",
            f"#scenario-{i} svg.chart",
        )
        for chart in drawn:
            assert chart == {"shapes": destinations, "legend": destinations, "empty": 0}, drawn


def shoot(browser: Any, name: str) -> Path:
    """A screenshot of the whole page: the window stretched to the page's height."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(WINDOW[0], height + 140)  # the headless window's frame
    try:
        return screenshot(browser, name)
    finally:
        browser.set_window_size(*WINDOW)


def test_a_run_that_held_says_so_first(transactional_db, browser, tmp_path):
    from selenium.webdriver.common.by import By

    # given: a real run where every invariant held
    export = evaluate_all([tiny(tight=False)], seed=1)
    assert export["held"], [v for v in export["scenarios"][0]["verdicts"] if not v["held"]]

    # when
    page = open_report(browser, export, tmp_path)

    # then: the verdict is the first thing on the page, and green
    assert browser.title == "webhook_eval: every invariant held (seed 1)"
    banner = browser.find_element(By.ID, "all-held")
    assert banner.is_displayed() and banner.location["y"] < 200
    assert "Every invariant held" in banner.text
    assert not browser.find_elements(By.CSS_SELECTOR, ".broken-box")
    row = browser.find_element(By.CSS_SELECTOR, "table.verdicts tbody tr")
    assert row.text.split()[:2] == ["PASS", "tiny"]
    # the scenario's text is shown as written, and did not run
    description = browser.find_element(By.CSS_SELECTOR, "#scenario-0 > p")
    assert description.text == DESCRIPTION
    # the figures, the charts, the engine's numbers apart
    metrics = browser.find_elements(By.CSS_SELECTOR, "#scenario-0 table.metrics tbody tr")
    assert [r.text.split()[0] for r in metrics] == ["fast", "slow"]
    charts_drawn(browser, export)
    footer = browser.find_element(By.TAG_NAME, "footer")
    assert "Measured on this machine and database (not compared)" in footer.text
    assert f"database {export['database']}" in footer.text
    nothing_fetched(browser, page)
    no_sideways_scroll(browser, ".scroll")
    shoot(browser, "eval-report-pass")


def test_a_broken_limiter_is_a_red_box_at_the_top(transactional_db, browser, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By

    # given: a real defect: the limiter finds its bucket full whenever it looks
    limiter_overspends(monkeypatch)
    export = evaluate_all([tiny(tight=True)], seed=1)
    verdicts = export["scenarios"][0]["verdicts"]
    broken = [v for v in verdicts if not v["held"]]
    assert "limiter-within-rate" in [v["name"] for v in broken]
    limiter = next(v for v in broken if v["name"] == "limiter-within-rate")

    # when
    page = open_report(browser, export, tmp_path)

    # then: a red box per broken invariant, the limiter's first, at the top of the page
    assert browser.title.startswith("webhook_eval: ") and "broken" in browser.title
    assert not browser.find_elements(By.ID, "all-held")
    boxes = browser.find_elements(By.CSS_SELECTOR, "#verdicts .broken-box")
    assert [b.get_attribute("data-invariant") for b in boxes] == [v["name"] for v in broken]
    box = boxes[[v["name"] for v in broken].index("limiter-within-rate")]
    assert box.is_displayed()
    assert boxes[0].location["y"] < 200
    assert "BROKEN: limiter-within-rate" in box.text
    assert limiter["title"] in box.text
    assert "in scenario tiny" in box.text
    assert f"first: {limiter['first']}" in box.text
    assert limiter["first"].startswith("slow: ")
    replay = box.find_element(By.CSS_SELECTOR, "pre code")
    assert (
        replay.text
        == export["scenarios"][0]["replay"]
        == ("python manage.py webhook_eval tiny --seed 1")
    )
    colour = box.value_of_css_property("border-top-color")
    assert colour == "rgba(179, 38, 30, 1)", colour  # the report's red
    row = browser.find_element(By.CSS_SELECTOR, "table.verdicts tbody tr")
    assert row.text.startswith("FAIL tiny") and "broken limiter-within-rate" in row.text
    # the scenario's invariants table marks it too
    marked = browser.find_elements(By.CSS_SELECTOR, "#scenario-0 table.invariants tr.broken")
    assert [r.find_element(By.CSS_SELECTOR, "td.mono").text for r in marked] == [
        v["name"] for v in broken
    ]
    charts_drawn(browser, export)
    nothing_fetched(browser, page)
    no_sideways_scroll(browser, ".scroll")
    shoot(browser, "eval-report-broken")
