"""The terminal report of a run, and what changed against a saved one.

The report's body is the same, to the byte, for the same scenarios and seed on any
database and machine; what is not (the database's statement counts, the wall clock)
comes last, under a heading that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils.translation import ngettext

from ..presentation.display import duration_text

LINE = "-" * 100


def _num(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:,.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    else:
        text = f"{value:,}"
    return text + unit


def _age(seconds: float | None) -> str:
    """A measured duration in a column, as the app words one: 4.2 s, 3 min 05 s, 2 h 07 min."""
    if seconds is None:
        return "-"
    return duration_text(timedelta(seconds=seconds), precise=True)


def held_back_words(m: dict[str, Any]) -> str:
    """Messages held behind a terminal one of their ordering key: they wait for an
    operator, not for the relay, and are not counted in the oldest eligible age."""
    behind = ", ".join(
        f"{e['behind']} ({e['held']}, for {_age(e['held_for_s'])})" for e in m["held_behind"]
    )
    return (
        f"held back for an operator: {_num(m['held_back_at_cut_off'])} at the cut-off "
        f"(at most {_num(m['held_back_max'])}, the longest for {_age(m['held_back_longest_s'])})"
        + (f", behind {behind}" if behind else "")
    )


def verdict_lines(export: dict[str, Any]) -> list[str]:
    lines = []
    for s in export["scenarios"]:
        broken = [v for v in s["verdicts"] if not v["held"]]
        state = "VOID" if s["void"] else "PASS" if not broken else "FAIL"
        held = len(s["verdicts"]) - len(broken)
        words = f"{held} of {len(s['verdicts'])} invariants held"
        if broken:
            words += ": broken " + ", ".join(v["name"] for v in broken)
        lines.append(f"  {state:<5} {s['name']:<24} {words}")
        if broken or s["void"]:
            lines.append(f"        replay (seed {s['seed']}): {s['replay']}")
    return lines


def text_report(export: dict[str, Any]) -> str:
    """The report: its body (the same wherever it runs), then this machine's figures."""
    return body_text(export) + machine_text(export)


def body_text(export: dict[str, Any]) -> str:
    scenarios = export["scenarios"]
    counted = ngettext("%d scenario", "%d scenarios", len(scenarios)) % len(scenarios)
    out = [
        f"webhook_eval: {counted}, seed {export['seed']}",
        "",
        "VERDICTS",
        *verdict_lines(export),
    ]
    for s in scenarios:
        out += ["", LINE, f"{s['name']}: {s['description']}".rstrip(": "), LINE]
        out += _scenario_lines(s)
    return "\n".join(out) + "\n"


def machine_text(export: dict[str, Any]) -> str:
    """What differs by database engine and machine, under a heading that says so."""
    scenarios = export["scenarios"]
    out = ["", LINE, "Measured on this machine and database (not compared byte for byte)", LINE]
    out.append(f"  database: {export['database']}; code: {export['code_version']}")
    for s in scenarios:
        e = s["metrics"]["engine_dependent"]
        out.append(
            f"  {s['name']:<24} {_num(e['statements_per_delivery'])} statements a delivery, "
            f"{_num(e['statements_per_admission'])} an admission, "
            f"{_num(e['sweep_statements_per_hour'])} sweep statements an hour; "
            f"wall clock {s['metrics']['wall_clock_s']:g} s"
        )
    return "\n".join(out) + "\n"


def _scenario_lines(s: dict[str, Any]) -> list[str]:
    out = [f"  simulated {_age(s['duration_s'])}, seed {s['seed']}", "", "  invariants"]
    for v in s["verdicts"]:
        state = "held  " if v["held"] else "BROKEN"
        checked = f"({_num(v['checked'])} checked)" if v["checked"] else "(nothing to check)"
        out.append(f"    {state} {v['name']:<24} {checked}")
        if not v["held"]:
            out.append(f"           first: {v['first']}")
    if not s["held"]:
        out.append(f"    replay: {s['replay']}")
    if s["void"]:
        out.append("    VOID: the ledger does not balance, so nothing above proves anything")
    dests = s["metrics"]["destinations"]
    if dests:
        out += ["", "  per destination (latency from the scheduled admission to the 2xx)"]
        head = (
            f"    {'destination':<16}{'limits':>14}{'admitted':>9}{'deliv.':>8}{'term.':>6}"
            f"{'pend.':>6}{'held':>5}{'p50':>12}{'p95':>12}{'max':>12}{'oldest':>12}"
            f"{'att/d':>7}"
            f"{'dedup us/them':>15}{'util':>6}"
        )
        out.append(head)
        for d in s["destinations"]:
            m = dests[d["name"]]
            limits = f"{d['rate']}+{d['burst']},{d['max_in_flight']}"
            out.append(
                f"    {d['name']:<16}{limits:>14}{_num(m['admitted']):>9}"
                f"{_num(m['delivered']):>8}{_num(m['terminal']):>6}"
                f"{_num(m['pending_at_cut_off']):>6}{_num(m['held_back_at_cut_off']):>5}"
                # a duration is up to 11 characters wide ("59 min 59 s")
                f"{_age(m['latency_p50_s']):>12}"
                f"{_age(m['latency_p95_s']):>12}{_age(m['latency_max_s']):>12}"
                f"{_age(m['oldest_eligible_max_s']):>12}{_num(m['attempts_per_delivered']):>7}"
                f"{_num(m['dedup_hits_admission']) + '/' + _num(m['dedup_hits_merchant']):>15}"
                f"{_num(m['limiter_utilisation']):>6}"
            )
        for d in s["destinations"]:
            m = dests[d["name"]]
            if m["terminal_reasons"]:
                reasons = "; ".join(f"{n} {r}" for r, n in m["terminal_reasons"].items())
                out.append(f"    {d['name']}: terminal: {reasons}")
            if m["held_back_max"]:
                out.append(f"    {d['name']}: {held_back_words(m)}")
            if m["metadata_sums"]:
                sums = ", ".join(f"{k} {_num(v)}" for k, v in m["metadata_sums"].items())
                out.append(f"    {d['name']}: metadata summed: {sums}")
    r = s["metrics"]["receiver"]
    if r:
        answers = ", ".join(f"{n} {a}" for a, n in r["answers"].items())
        failed = ", ".join(f"{n} {st}" for st, n in r["failed_events"].items()) or "none"
        out += [
            "",
            f"  this app's receiver: {_num(r['requests'])} requests for {_num(r['events'])} "
            f"events ({answers}); applied {_num(r['applied'])}; failed events: {failed}; "
            f"silence alerts opened: {r['silence_alerts']}",
        ]
    return out


# --- comparing with a saved run -------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How far a metric may move before it is a regression: ``worse`` is the direction
    (+1: higher is worse), by more than ``relative`` of the saved value and ``absolute``."""

    worse: int
    relative: float
    absolute: float


TOLERANCES: dict[str, Tolerance] = {
    "latency_p50_s": Tolerance(+1, 0.20, 1.0),
    "latency_p95_s": Tolerance(+1, 0.20, 1.0),
    "latency_max_s": Tolerance(+1, 0.20, 5.0),
    "oldest_eligible_max_s": Tolerance(+1, 0.20, 5.0),
    "attempts_per_delivered": Tolerance(+1, 0.10, 0.05),
    "terminal": Tolerance(+1, 0.0, 0.0),
    "pending_at_cut_off": Tolerance(+1, 0.0, 0.0),
    "delivered": Tolerance(-1, 0.0, 0.0),
    "limiter_utilisation": Tolerance(-1, 0.10, 0.02),
}
# engine-dependent: compared only when both runs used the same database. A run's
# statements are as deterministic as its figures: one statement more a round of ten
# deliveries (+0.1 a delivery) is a regression.
ENGINE_TOLERANCES = {"statements_per_delivery": Tolerance(+1, 0.0, 0.05)}


def compare(now: dict[str, Any], saved: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(regressions, other changes) of ``now`` against ``saved``, in words."""
    regressions: list[str] = []
    changes: list[str] = []
    before = {s["name"]: s for s in saved.get("scenarios", [])}
    for s in now["scenarios"]:
        old = before.get(s["name"])
        if old is None:
            changes.append(f"{s['name']}: new scenario (nothing saved to compare with)")
            continue
        if old["seed"] != s["seed"]:
            changes.append(f"{s['name']}: seed {s['seed']}, saved with {old['seed']}")
        was = {v["name"]: v["held"] for v in old["verdicts"]}
        for v in s["verdicts"]:
            if not v["held"] and was.get(v["name"], True):
                regressions.append(f"{s['name']}: {v['name']} newly broken: {v['first']}")
            elif v["held"] and was.get(v["name"]) is False:
                changes.append(f"{s['name']}: {v['name']} holds now (was broken)")
        for dest, m in s["metrics"]["destinations"].items():
            o = old["metrics"]["destinations"].get(dest)
            if o is None:
                changes.append(f"{s['name']}/{dest}: new destination")
                continue
            _compare_metrics(f"{s['name']}/{dest}", m, o, TOLERANCES, regressions, changes)
        if now.get("database") == saved.get("database"):
            _compare_metrics(
                s["name"],
                s["metrics"]["engine_dependent"],
                old["metrics"]["engine_dependent"],
                ENGINE_TOLERANCES,
                regressions,
                changes,
            )
    return regressions, changes


def _compare_metrics(
    where: str,
    now: dict[str, Any],
    old: dict[str, Any],
    tolerances: dict[str, Tolerance],
    regressions: list[str],
    changes: list[str],
) -> None:
    for key, tol in tolerances.items():
        a, b = old.get(key), now.get(key)
        if a == b or a is None or b is None:
            if a != b:
                changes.append(f"{where}: {key} {_num(a)} -> {_num(b)}")
            continue
        delta = (b - a) * tol.worse
        allowed = max(abs(a) * tol.relative, tol.absolute)
        line = f"{where}: {key} {_num(a)} -> {_num(b)}"
        if delta > allowed:
            regressions.append(f"{line} (beyond the tolerance of {_num(allowed)})")
        else:
            changes.append(line)


def compare_text(regressions: list[str], changes: list[str], saved_path: str) -> str:
    out = [f"Compared with {saved_path}:"]
    if regressions:
        n = len(regressions)
        out.append("  " + ngettext("%d regression:", "%d regressions:", n) % n)
        out += [f"    REGRESSION {r}" for r in regressions]
    else:
        out.append("  no regression")
    if changes:
        out.append("  changes within tolerance:")
        out += [f"    {c}" for c in changes]
    return "\n".join(out) + "\n"
