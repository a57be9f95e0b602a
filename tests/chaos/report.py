"""The figures of a run and its report: answer times and throughput per fault window,
recovery after each fault, the checks; as text (the terminal, ``--out``) and as JSON
beside it.

A fault's window runs from the fault's start to its end (the process back, the server
started, the lock released). Its requests are those sent in it: answer time max and p99
(of the requests that got an answer), answered requests per second, and those without an
answer. ``calm`` is every request sent outside all windows. Recovery is measured from the
window's end: to the first sender request answered ``applied`` (inbound), and to the
first new effect the merchant recorded (outbound).

Outbound, per window: the merchant's latency, from a message's admission to its first
arrival at the merchant, of the messages admitted in the window (``calm``: outside all
of them); for ``noisy-neighbours``, also of those admitted in its hold, every neighbour
subscribed (the isolation check's figure).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from tests.chaos.checks import ISOLATION, Check, Requests, latency_figures, passed, percentile
from tests.chaos.faults import Window
from tests.chaos.watcher import HEALTH, STATUS


def window_figures(rows: list[list], start: float, end: float, calm: bool = False,
                   windows: list[Window] = ()) -> dict:  # fmt: skip
    def inside(t0: float) -> bool:
        if calm:
            return not any(w.start <= t0 <= w.end for w in windows) and start <= t0 <= end
        return start <= t0 <= end

    chosen = [r for r in rows if inside(r[4])]
    times = [r[5] - r[4] for r in chosen if r[6] is not None]
    seconds = max(end - start, 1e-6)
    if calm:
        seconds -= sum(max(0.0, min(w.end, end) - max(w.start, start)) for w in windows)
    statuses: dict[str, int] = {}
    for r in chosen:
        key = str(r[6]) if r[6] is not None else r[8].split(":")[0]
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "seconds": round(seconds, 1),
        "requests": len(chosen),
        "answered_per_second": round(len(times) / max(seconds, 1e-6), 1),
        "p50_ms": _ms(percentile(times, 0.5)),
        "p99_ms": _ms(percentile(times, 0.99)),
        "max_ms": _ms(max(times) if times else None),
        "answers": statuses,
    }


def _ms(value: float | None) -> int | None:
    return None if value is None else round(value * 1000)


def recovery(window: Window, rows: list[list], effects: list[float]) -> dict:
    applied = [r[5] for r in rows if r[7] == "applied" and r[5] >= window.end]
    delivered = [t for t in effects if t >= window.end]
    return {
        "inbound_s": round(min(applied) - window.end, 2) if applied else None,
        "outbound_s": round(min(delivered) - window.end, 2) if delivered else None,
    }


def figures(requests: Requests, windows: list[Window], effects: list[float],
            span: tuple[float, float], latencies: list[tuple[float, float]]) -> dict:  # fmt: skip
    """Per window and ``calm``; ``latencies``: (admitted at, seconds to the merchant's
    first arrival) per message of the merchant's."""
    rows = requests.rows

    def admitted_in(start: float, end: float) -> dict:
        return latency_figures([x for at, x in latencies if start <= at <= end])

    calm = [x for at, x in latencies if not any(w.start <= at <= w.end for w in windows)]
    result = {"calm": window_figures(rows, *span, calm=True, windows=windows)}
    result["calm"]["merchant_latency"] = latency_figures(calm)
    for w in windows:
        result[w.name] = window_figures(rows, w.start, w.end) | {
            "detail": w.detail,
            "recovery": recovery(w, rows, effects),
            "merchant_latency": admitted_in(w.start, w.end),
        }
        if w.hold:
            result[w.name]["merchant_latency_hold"] = admitted_in(*w.hold)
    return result


def render(meta: dict, checks: list[Check], per_window: dict, logs: dict[str, str],
           truth: list[dict] = ()) -> str:  # fmt: skip
    ok = passed(checks)
    lines = [
        f"chaos run {meta['run']}: {'PASSED' if ok else 'FAILED'}",
        f"  {meta['mode']}, {meta['events']} events, {meta['requests']} requests over "
        f"{meta['send_seconds']:.0f} s ({meta['requests_per_second']:.1f} req/s), drain "
        f"{meta['drain_seconds']:.1f} s, wall time {meta['wall_seconds']:.0f} s, code "
        f"{meta['commit']}",
    ]
    if meta.get("planted"):
        lines.append(f"  a defect planted on purpose: --plant {meta['planted']}")
    lines += ["", "checks:"]
    for check in checks:
        mark = "ok" if check.ok else "FAIL" if check.required else "pending"
        lines.append(f"  [{mark}] {check.name}")
        lines.append(f"        {check.detail}")
    for exit in meta.get("unplanned_exits", []):
        lines.append(f"  [warn] {exit['process']} exited on its own (code {exit['code']}, "
                     f"during {exit['during']}) and was started again: {exit['line']}")  # fmt: skip
    survived = meta.get("worker_survived_broker_outage")
    if survived is not None:
        lines.append("  the Celery worker survived the broker outage: " + (
            "yes" if survived else "no (it exited; the supervisor started another)"))  # fmt: skip
    lines += [
        "",
        "fault windows (requests sent in the window; times of those answered):",
        f"  {'window':16} {'secs':>6} {'reqs':>6} {'ans/s':>6} {'p50ms':>6} {'p99ms':>6} "
        f"{'maxms':>6} {'in_rec':>7} {'out_rec':>7}  answers",
    ]
    for name, f in per_window.items():
        rec = f.get("recovery", {})
        lines.append(
            f"  {name:16} {f['seconds']:>6} {f['requests']:>6} {f['answered_per_second']:>6} "
            f"{_v(f['p50_ms'])} {_v(f['p99_ms'])} {_v(f['max_ms'])} "
            f"{_v(rec.get('inbound_s'), 7)} {_v(rec.get('outbound_s'), 7)}  "
            + " ".join(f"{k}:{n}" for k, n in sorted(f["answers"].items()))
        )
    lines += ["  (in_rec/out_rec: seconds from the window's end to the first event applied /"]
    lines += ["   message newly delivered; '-' for calm, or none seen)"]
    lines += [
        "",
        "outbound: the merchant's latency, admission to first arrival, of the messages",
        "admitted in the window (seconds):",
        f"  {'window':23} {'msgs':>6} {'p50':>7} {'p99':>7} {'max':>7} {'never':>6}",
    ]
    for name, f in per_window.items():
        for label, key in ((name, "merchant_latency"), (f"{name} (hold)", "merchant_latency_hold")):
            if key in f:
                lat = f[key]
                lines.append(
                    f"  {label:23} {lat['messages']:>6} {_sv(lat['p50_s'])} "
                    f"{_sv(lat['p99_s'])} {_sv(lat['max_s'])} {lat['never_arrived']:>6}"
                )
    isolation = next((c for c in checks if c.name == ISOLATION), None)
    if isolation and isolation.figures:
        lines.append(_isolation_line(isolation))
    lines += truth_lines(truth)
    details = [f"  {name}: {f['detail']}" for name, f in per_window.items() if f.get("detail")]
    lines += ["", "faults:", *details]
    lines += ["", "logs:"] + [f"  {name}: {path}" for name, path in logs.items()]
    return "\n".join(lines) + "\n"


def truth_lines(table: list[dict]) -> list[str]:
    """What status and health said per fault (truth.py): first wrong, seconds after the
    fault began; OK again, seconds after it ended; '*' marks a probe held to the fault."""
    if not table:
        return []
    lines = [
        "",
        "status and health through the faults (UTC; wrong: +s after it began; ok again: +s",
        "after it ended, negative before; ok-in: OK answers during it after it said wrong;",
        "answers ok/wrong/none of the probes asked in it; unans: probes not answered within",
        "their bound from its start to a minute after its end; * held by the truthful check):",
        f"  {'fault':17} {'began':>8} {'ended':>8} {'probe':7} {'before':>6} {'wrong':>7} "
        f"{'ok again':>8} {'ok-in':>6} {'answers':<9} {'unans':>5}  first wrong said",
    ]
    for row in table:
        for kind in (HEALTH, STATUS):
            f, first = row[kind], kind == HEALTH
            a = f["answers"]
            answers = f"{a['ok']}/{a['wrong']}/{a['none']}"
            lines.append(
                f"  {row['fault'] if first else '':17} {_clock(row['began']) if first else '':>8} "
                f"{_clock(row['ended']) if first else '':>8} "
                f"{kind + ('*' if f['held'] else ''):7} {f['before'] or '-':>6} "
                f"{_plus(f['first_wrong_s']):>7} {_plus(f['ok_again_s']):>8} "
                f"{'yes ' + str(f['ok_during']) if f['ok_during'] else 'no':>6} "
                f"{answers:<9} {f['unanswered']:>5}  {(f['first_wrong_said'] or '-')[:70]}"
            )
    return lines


def _clock(at: float) -> str:
    return f"{datetime.fromtimestamp(at, UTC):%H:%M:%S}"


def _plus(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:+.1f}"


def _isolation_line(check: Check) -> str:
    """The figure of the noisy-neighbours fault, in a line."""
    f = check.figures
    beside, calm = f["beside"]["p99_s"], f["calm"]["p99_s"]
    return (
        f"  noisy-neighbours: merchant p99 {_s(beside)} ({_s(calm)} before the first fault; bound "
        f"{_s(f['bound_s'])}: {'within' if check.ok else 'OVER'}); neighbours {f['neighbours']}"
    )


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def _sv(seconds: float | None) -> str:
    return f"{'-' if seconds is None else f'{seconds:.2f}':>7}"


def _v(value, width: int = 6) -> str:
    return f"{'-' if value is None else value:>{width}}"


def write(path: Path, text: str, meta: dict, checks: list[Check], per_window: dict,
          truth: list[dict] = ()) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    data = {"meta": meta, "checks": [asdict(c) for c in checks], "windows": per_window,
            "status_and_health": list(truth)}  # fmt: skip
    path.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str))
