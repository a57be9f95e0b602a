"""The evaluation's report as one self-contained HTML file (``webhook_eval --html``):
the verdicts first (a broken invariant in a red box with its first occurrence and the
command that replays it), then per scenario its invariants, its figures and charts.

One file, no script, no stylesheet or font fetched, charts drawn as inline SVG here: it
opens offline, attached to a ticket or kept as a CI artefact, and looks the same
years later. Every text taken from the export is escaped (scenario names, descriptions
and verdict texts come from files a team writes).
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import ngettext

from ..presentation.svg import join
from .report import _age, _num, held_back_words
from .report_charts import scenario_charts

STYLE = """
:root { color-scheme: light; --ink: #1f2328; --muted: #5b636d; --line: #d8dde3;
  --soft: #f5f7f9; --bad: #b3261e; --bad-soft: #fdecea; --good: #1f7a4a;
  --good-soft: #e8f5ee; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.45;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 21px; margin: 0 0 6px; }
h3 { font-size: 16px; margin: 22px 0 8px; }
.meta, .muted { color: var(--muted); }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 13px; }
pre.replay { background: #fff; border: 1px solid var(--bad); border-radius: 4px;
  padding: 8px 10px; margin: 6px 0 0; white-space: pre-wrap; word-break: break-all; }
.banner { border-radius: 6px; padding: 16px 20px; margin: 18px 0; font-size: 18px; }
.held-banner { background: var(--good-soft); border: 2px solid var(--good);
  color: var(--good); font-weight: 600; }
.broken-box { background: var(--bad-soft); border: 3px solid var(--bad); border-radius: 6px;
  padding: 14px 18px; margin: 18px 0; }
.broken-box h2 { color: var(--bad); font-size: 22px; }
.broken-box p { margin: 6px 0; }
.badge { display: inline-block; min-width: 52px; text-align: center; font-weight: 700;
  font-size: 13px; border-radius: 4px; padding: 1px 8px; }
.pass { background: var(--good-soft); color: var(--good); border: 1px solid var(--good); }
.fail, .void { background: var(--bad); color: #fff; border: 1px solid var(--bad); }
table { border-collapse: collapse; width: 100%; margin: 4px 0 8px; font-size: 14px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: left;
  vertical-align: top; }
th { background: var(--soft); font-weight: 600; white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.broken td { background: var(--bad-soft); }
tr.broken td.state { color: var(--bad); font-weight: 700; }
td.state, td.mono { white-space: nowrap; }
table.metrics th { white-space: normal; vertical-align: bottom; }
section.scenario { border-top: 2px solid var(--line); margin-top: 34px; padding-top: 20px; }
.scroll { overflow-x: auto; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr));
  gap: 18px 26px; }
figure { margin: 0; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 2px; }
svg.chart { width: 100%; height: auto; display: block; background: #fff;
  border: 1px solid var(--line); border-radius: 4px; }
svg .chart-title { font-size: 14px; font-weight: 600; fill: var(--ink); }
svg .legend, svg .tick, svg .axis-label { font-size: 11px; fill: var(--muted); }
svg .axis { stroke: #8a939d; stroke-width: 1; }
svg .grid { stroke: #eceff2; stroke-width: 1; }
svg .reference { stroke: var(--ink); stroke-width: 1.2; stroke-dasharray: 6 4; }
svg .data { fill: none; stroke-width: 1.8; stroke-linejoin: round; }
svg .histogram { fill-opacity: 0.14; }
svg .empty { font-size: 15px; fill: var(--muted); font-style: italic; }
footer { border-top: 2px solid var(--line); margin-top: 40px; padding-top: 16px; }
"""


def html_report(export: dict[str, Any]) -> str:
    """The whole page for an export of ``evaluate_all`` (or a run saved by ``--save``)."""
    scenarios = export["scenarios"]
    broken = sum(1 for s in scenarios for v in s["verdicts"] if not v["held"])
    outcome = "every invariant held"
    if not export["held"]:
        outcome = ngettext("%d invariant broken", "%d invariants broken", broken) % broken
    counted = ngettext("%d scenario", "%d scenarios", len(scenarios)) % len(scenarios)
    body = [
        format_html(
            '<header><h1>Delivery evaluation</h1><p class="meta">{}, seed {}; '
            "code {}; database {}</p></header>",
            counted,
            export["seed"],
            export["code_version"],
            export["database"],
        ),
        _verdicts(export),
        *(_scenario(i, s) for i, s in enumerate(scenarios)),
        _footer(export),
    ]
    head = format_html(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>webhook_eval: {} (seed {})</title><style>{}</style></head>",
        outcome,
        export["seed"],
        mark_safe(STYLE),
    )
    return str(join([head, mark_safe("<body><main>"), *body, mark_safe("</main></body></html>\n")]))


def _state(s: dict[str, Any]) -> str:
    """PASS, FAIL or VOID, as the terminal report says it."""
    if s["void"]:
        return "VOID"
    return "PASS" if s["held"] else "FAIL"


def _verdicts(export: dict[str, Any]) -> SafeString:
    """The top of the page: a red box per broken invariant (or one green banner), then
    a row per scenario."""
    parts: list[object] = [mark_safe('<section id="verdicts">')]
    if export["held"]:
        parts.append(
            format_html(
                '<div class="banner held-banner" id="all-held">&#10004; Every invariant held '
                "in every scenario ({}, seed {}).</div>",
                ngettext("%d scenario", "%d scenarios", len(export["scenarios"]))
                % len(export["scenarios"]),
                export["seed"],
            )
        )
    for i, s in enumerate(export["scenarios"]):
        for v in s["verdicts"]:
            if not v["held"]:
                parts.append(_broken_box(i, s, v))
    rows = []
    for i, s in enumerate(export["scenarios"]):
        broken = [v["name"] for v in s["verdicts"] if not v["held"]]
        held = len(s["verdicts"]) - len(broken)
        rows.append(
            format_html(
                '<tr class="{}"><td class="state"><span class="badge {}">{}</span></td>'
                '<td><a href="#scenario-{}">{}</a></td><td>{} of {} invariants held{}</td></tr>',
                "broken" if broken else "",
                _state(s).lower(),
                _state(s),
                i,
                s["name"],
                held,
                len(s["verdicts"]),
                ": broken " + ", ".join(broken) if broken else "",
            )
        )
    parts += [
        mark_safe('<h2>Verdicts</h2><table class="verdicts"><thead><tr><th>state</th>'),
        mark_safe("<th>scenario</th><th>invariants</th></tr></thead><tbody>"),
        *rows,
        mark_safe("</tbody></table></section>"),
    ]
    return join(parts)


def _broken_box(i: int, s: dict[str, Any], v: dict[str, Any]) -> SafeString:
    void = ""
    if s["void"]:
        void = format_html(
            "<p><strong>VOID:</strong> {}</p>",
            "the ledger does not balance, so nothing else in this scenario proves anything",
        )
    return format_html(
        '<div class="broken-box" data-invariant="{}"><h2>&#10006; BROKEN: {}</h2>'
        "<p><strong>{}</strong></p>"
        '<p>in scenario <a href="#scenario-{}"><strong>{}</strong></a></p>'
        '<p>first: <span class="mono">{}</span></p>{}'
        '<p>replay it:</p><pre class="replay"><code>{}</code></pre></div>',
        v["name"],
        v["name"],
        v["title"],
        i,
        s["name"],
        v["first"] or "(no first occurrence recorded)",
        void,
        s["replay"],
    )


def _scenario(i: int, s: dict[str, Any]) -> SafeString:
    state = _state(s)
    parts: list[object] = [
        format_html(
            '<section class="scenario" id="scenario-{}"><h2><span class="badge {}">{}</span> '
            "{}</h2>",
            i,
            state.lower(),
            state,
            s["name"],
        ),
    ]
    if s["description"]:
        parts.append(format_html("<p>{}</p>", s["description"]))
    parts.append(
        format_html(
            '<p class="meta">simulated {}, seed {}; replay: <code>{}</code></p>',
            _age(s["duration_s"]),
            s["seed"],
            s["replay"],
        )
    )
    parts += [_invariants(s), _destinations(s), _receiver(s), scenario_charts(i, s)]
    parts.append(mark_safe("</section>"))
    return join(parts)


def _invariants(s: dict[str, Any]) -> SafeString:
    rows = []
    for v in s["verdicts"]:
        checked = _num(v["checked"]) if v["checked"] else "nothing to check"
        rows.append(
            format_html(
                '<tr class="{}"><td class="state">{}</td><td class="mono">{}</td><td>{}</td>'
                '<td class="n">{}</td><td>{}</td></tr>',
                "" if v["held"] else "broken",
                "held" if v["held"] else "BROKEN",
                v["name"],
                v["title"],
                checked,
                "" if v["held"] else v["first"],
            )
        )
    parts: list[object] = [
        mark_safe('<h3>Invariants</h3><table class="invariants"><thead><tr><th>state</th>'),
        mark_safe('<th>name</th><th>what it says</th><th class="n">checked</th>'),
        mark_safe("<th>first broken by</th></tr></thead><tbody>"),
        *rows,
        mark_safe("</tbody></table>"),
    ]
    if s["void"]:
        parts.append(
            mark_safe(
                '<p class="broken-box"><strong>VOID:</strong> the ledger does not balance, '
                "so nothing above proves anything.</p>"
            )
        )
    return join(parts)


COLUMNS = (
    ("limits", "rate + burst, in flight"),
    ("admitted", ""),
    ("delivered", ""),
    ("terminal", ""),
    ("pending at cut-off", ""),
    ("held back at cut-off", "behind a terminal message of their ordering key: for an operator"),
    ("p50", "latency from the scheduled admission to the 2xx"),
    ("p95", ""),
    ("max", ""),
    (
        "oldest eligible max",
        "the oldest message the relay could send, at its worst (held-back ones apart)",
    ),
    ("attempts per delivered", ""),
    ("dedup ours / merchant", "admissions deduplicated here / duplicates the merchant saw"),
    ("limiter utilisation", "requests sent over what the rate allowed while busy"),
)


def _destinations(s: dict[str, Any]) -> SafeString:
    dests = s["metrics"]["destinations"]
    if not dests:
        return mark_safe("")
    head = join(
        [format_html('<th class="n" title="{}">{}</th>', tip, name) for name, tip in COLUMNS]
    )
    rows: list[object] = []
    notes: list[object] = []
    for d in s["destinations"]:
        m = dests[d["name"]]
        cells = [
            f"{d['rate']}+{d['burst']}, {d['max_in_flight']}",
            _num(m["admitted"]),
            _num(m["delivered"]),
            _num(m["terminal"]),
            _num(m["pending_at_cut_off"]),
            _num(m["held_back_at_cut_off"]),
            _age(m["latency_p50_s"]),
            _age(m["latency_p95_s"]),
            _age(m["latency_max_s"]),
            _age(m["oldest_eligible_max_s"]),
            _num(m["attempts_per_delivered"]),
            f"{_num(m['dedup_hits_admission'])} / {_num(m['dedup_hits_merchant'])}",
            _num(m["limiter_utilisation"]),
        ]
        rows.append(
            format_html(
                "<tr><td>{}</td>{}</tr>",
                d["name"],
                join([format_html('<td class="n">{}</td>', c) for c in cells]),
            )
        )
        if m["terminal_reasons"]:
            reasons = "; ".join(f"{n} {r}" for r, n in m["terminal_reasons"].items())
            notes.append(format_html("<li>{}: terminal: {}</li>", d["name"], reasons))
        if m["held_back_max"]:
            notes.append(format_html("<li>{}: {}</li>", d["name"], held_back_words(m)))
        if m.get("metadata_sums"):
            sums = ", ".join(f"{k} {_num(v)}" for k, v in m["metadata_sums"].items())
            notes.append(format_html("<li>{}: metadata summed: {}</li>", d["name"], sums))
    return join(
        [
            mark_safe("<h3>Per destination</h3>"),
            mark_safe('<p class="muted">latency from the scheduled admission to the 2xx</p>'),
            mark_safe('<div class="scroll"><table class="metrics"><thead><tr>'),
            format_html("<th>destination</th>{}</tr></thead><tbody>", head),
            *rows,
            mark_safe("</tbody></table></div>"),
            *([mark_safe("<ul>"), *notes, mark_safe("</ul>")] if notes else []),
        ]
    )


def _receiver(s: dict[str, Any]) -> SafeString:
    r = s["metrics"]["receiver"]
    if not r:
        return mark_safe("")
    answers = ", ".join(f"{n} {a}" for a, n in r["answers"].items())
    failed = ", ".join(f"{n} {st}" for st, n in r["failed_events"].items()) or "none"
    return format_html(
        "<h3>This app's receiver</h3><p>{} requests for {} events ({}); applied {}; "
        "failed events: {}; silence alerts opened: {}</p>",
        _num(r["requests"]),
        _num(r["events"]),
        answers,
        _num(r["applied"]),
        failed,
        r["silence_alerts"],
    )


def _footer(export: dict[str, Any]) -> SafeString:
    """What differs by engine and machine, apart, so nobody reads it as a regression."""
    rows = []
    for s in export["scenarios"]:
        e = s["metrics"]["engine_dependent"]
        phases = ", ".join(f"{k} {_num(v)}" for k, v in e["statements_by_phase"].items())
        rows.append(
            format_html(
                '<tr><td>{}</td><td class="n">{}</td><td class="n">{}</td><td class="n">{} s</td>'
                '<td class="muted">{}</td></tr>',
                s["name"],
                _num(e["statements_per_delivery"]),
                _num(e["statements_per_admission"]),
                _num(s["metrics"]["wall_clock_s"]),
                phases,
            )
        )
    return join(
        [
            mark_safe("<footer><h2>Measured on this machine and database (not compared)</h2>"),
            format_html(
                '<p class="meta">database {}; code {}</p>',
                export["database"],
                export["code_version"],
            ),
            mark_safe('<div class="scroll"><table class="engine"><thead><tr><th>scenario</th>'),
            mark_safe('<th class="n">statements per delivery</th>'),
            mark_safe('<th class="n">statements per admission</th><th class="n">wall clock</th>'),
            mark_safe("<th>statements by phase</th></tr></thead><tbody>"),
            *rows,
            mark_safe("</tbody></table></div></footer>"),
        ]
    )
