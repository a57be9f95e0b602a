"""The figures of one run, per destination and for the receiver: what a person reads
beside the verdicts, and what ``--compare`` holds a later run to.

Latency is measured from the *scheduled* admission time (the scenario's clock, not the
moment the simulation got round to it), to the delivery the merchant answered 2xx.
Every figure here is simulated and deterministic, but ``statements`` (which differ by
database engine) and the wall-clock time, which the report labels as such.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, overload

from .observed import Observations

# points per time series in the export and the charts
SERIES_POINTS = 120


def percentile(values: list[float], share: float) -> float | None:
    """Nearest rank: a value that occurred, the same on every machine."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@overload
def _r(value: float, digits: int = 3) -> float: ...
@overload
def _r(value: None, digits: int = 3) -> None: ...
@overload
def _r(value: float | None, digits: int = 3) -> float | None: ...
def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def measure(obs: Observations) -> dict[str, Any]:
    scheduled: dict[tuple[str, str], float] = {}
    ours: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for a in obs.admissions:
        scheduled.setdefault((a["destination"], a["key"]), a["at"])
        if not a["created"]:
            ours[a["destination"]]["coalesced" if a["coalesced"] else "constraint"] += 1
    destinations: dict[str, Any] = {}
    total_delivered = 0
    for spec in obs.scenario.destinations:
        name = spec.name
        messages = [m for m in obs.messages if m["destination"] == name]
        delivered = [m for m in messages if m["status"] == "delivered"]
        total_delivered += len(delivered)
        latencies = [m["delivered"] - scheduled[(name, m["key"])] for m in delivered]
        failed = [m for m in messages if m["status"] == "failed"]
        arrivals = obs.arrivals.get(name, [])
        samples = obs.samples.get(name, [])
        rate = spec.rate_count / spec.rate_seconds
        busy = _busy_span(messages, scheduled, name, obs.cut_off)
        allowed = rate * busy + max(1, spec.burst)
        destinations[name] = {
            "admitted": len(messages),
            "delivered": len(delivered),
            "terminal": len(failed),
            "terminal_reasons": dict(Counter(_reason(m) for m in failed).most_common(3)),
            "pending_at_cut_off": len(messages) - len(delivered) - len(failed),
            "latency_p50_s": _r(percentile(latencies, 0.50)),
            "latency_p95_s": _r(percentile(latencies, 0.95)),
            "latency_max_s": _r(max(latencies) if latencies else None),
            # what the relay could send; what waits for an operator is held back, apart
            "oldest_eligible_max_s": _r(max((s[2] for s in samples), default=0.0)),
            "held_back_max": max((s[3] for s in samples), default=0),
            "held_back_longest_s": _r(max((s[4] for s in samples), default=0.0)),
            "held_back_at_cut_off": sum(e["held"] for e in obs.held_back.get(name, [])),
            "held_behind": obs.held_back.get(name, [])[:3],
            # samples the status judged the backlog behind, or not sending
            "judged": dict(Counter(code for _, code in obs.judged.get(name, []) if code)),
            "attempts_per_delivered": _r(
                sum(m["attempts"] for m in delivered) / len(delivered) if delivered else None
            ),
            "requests_at_merchant": len(arrivals),
            "dedup_hits_admission": ours[name]["coalesced"] + ours[name]["constraint"],
            "dedup_hits_admission_window": ours[name]["coalesced"],
            "dedup_hits_merchant": sum(a.outcome == "duplicate" for a in arrivals),
            "limiter_utilisation": _r(len(arrivals) / allowed if allowed else None),
            "metadata_sums": _metadata_sums(messages),
            "latency_histogram": _histogram(latencies),
            "series": _series(samples, arrivals, rate, obs.cut_off),
        }
    relay_statements = obs.statements["relay"] + obs.statements["crash"]
    return {
        "destinations": destinations,
        "receiver": _receiver(obs),
        "engine_dependent": {
            "statements_per_delivery": _r(
                relay_statements / total_delivered if total_delivered else None, 2
            ),
            "statements_per_admission": _r(
                obs.statements["admit"] / len(obs.admissions) if obs.admissions else None, 2
            ),
            "sweep_statements_per_hour": _r(
                obs.statements["sweep"] * 3600 / obs.cut_off if obs.cut_off else None, 1
            ),
            "statements_by_phase": dict(sorted(obs.statements.items())),
        },
        "wall_clock_s": round(obs.wall_seconds, 2),
    }


def _histogram(values: list[float], bins: int = 24) -> list[list[float]]:
    """[upper edge in seconds, count] for ``bins`` equal bins from 0 to the maximum."""
    if not values:
        return []
    top = max(values) or 1.0
    width = top / bins
    counts = Counter(min(int(v / width), bins - 1) for v in values)
    return [[_r((b + 1) * width, 3), counts[b]] for b in range(bins)]


def _busy_span(
    messages: list[dict[str, Any]], scheduled: dict[tuple[str, str], float], name: str, cut: float
) -> float:
    """From the destination's first admission to its last delivery (or the cut-off)."""
    if not messages:
        return 0.0
    start = min(scheduled[(name, m["key"])] for m in messages)
    ends = [m["delivered"] for m in messages if m["delivered"] is not None]
    open_ = any(m["delivered"] is None for m in messages)
    end = cut if open_ or not ends else max(ends)
    return max(0.0, end - start)


def _reason(m: dict[str, Any]) -> str:
    if m["last_status_code"]:
        return f"answered {m['last_status_code']}"
    return (m["last_error"] or "no reason").split(":")[0][:60]


def _metadata_sums(messages: list[dict[str, Any]]) -> dict[str, float]:
    sums: defaultdict[str, float] = defaultdict(int)  # as a Counter: an int stays one
    for m in messages:
        for key, value in (m.get("metadata") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                sums[key] += value
    return {k: _r(v) for k, v in sorted(sums.items())}


def _series(
    samples: list[tuple[float, int, float, int, float]],
    arrivals: list[Any],
    rate: float,
    cut: float,
) -> dict[str, list[list[float]]]:
    """Queue depth, oldest eligible age, messages held back and limiter utilisation over
    simulated time, at most SERIES_POINTS points each (each bucket keeps its largest
    value)."""
    width = max(1.0, cut / SERIES_POINTS)
    depth: dict[int, float] = {}
    oldest: dict[int, float] = {}
    held: dict[int, float] = {}
    for at, count, age, held_count, _held_age in samples:
        b = min(int(at / width), SERIES_POINTS - 1)
        depth[b] = max(depth.get(b, 0), count)
        oldest[b] = max(oldest.get(b, 0.0), age)
        held[b] = max(held.get(b, 0), held_count)
    started = Counter(min(int(a.at / width), SERIES_POINTS - 1) for a in arrivals)
    buckets = range(min(SERIES_POINTS, int(math.ceil(cut / width))))
    return {
        "depth": [[_r(b * width, 1), depth.get(b, 0)] for b in buckets],
        "oldest_age_s": [[_r(b * width, 1), _r(oldest.get(b, 0.0), 1)] for b in buckets],
        "held_back": [[_r(b * width, 1), held.get(b, 0)] for b in buckets],
        "utilisation": [[_r(b * width, 1), _r(started[b] / (rate * width), 3)] for b in buckets],
    }


def _receiver(obs: Observations) -> dict[str, Any] | None:
    if obs.scenario.inbound is None:
        return None
    answers = Counter(s["status"] for s in obs.inbound_sent)
    failed = Counter(obs.inbound_failed.values())
    return {
        "requests": len(obs.inbound_sent),
        "events": len({s["key"] for s in obs.inbound_sent}),
        "answers": dict(sorted(answers.items())),
        "dedup_hits": answers.get("duplicate", 0),
        "applied": sum(1 for n in obs.inbound_effects.values() if n),
        "failed_events": dict(sorted(failed.items())),
        "silence_alerts": sum(n["note"] == "opened" for n in obs.silence),
    }
