"""Figures from the load phases: per-round stats, medians, ratios, targets."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .load import PhaseResult

BARE, CLAIM, FULL = "bare", "claim-floor", "full"
ENDPOINTS = (BARE, CLAIM, FULL)
NEW, DUPLICATE = "new", "duplicate"
PHASES = (NEW, DUPLICATE)

# full / claim-floor throughput: (phase, floor that must be met, aim)
TARGETS = ((NEW, 0.80, 1.00), (DUPLICATE, 0.90, 1.20))


@dataclass(frozen=True)
class Stats:
    requests: int
    errors: int
    elapsed_s: float
    rps: float
    p50_ms: float
    p99_ms: float


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: a latency some request really had."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def stats_of(result: PhaseResult) -> Stats:
    return Stats(
        requests=result.requests,
        errors=result.errors,
        elapsed_s=result.elapsed_s,
        rps=result.requests / result.elapsed_s if result.elapsed_s else 0.0,
        p50_ms=percentile(result.latencies_ms, 0.50),
        p99_ms=percentile(result.latencies_ms, 0.99),
    )


# rounds[endpoint][phase] -> one Stats per round, in round order
Rounds = dict[str, dict[str, list[Stats]]]


def median_stats(rounds: Sequence[Stats]) -> Stats:
    """Each figure's median over the rounds (rounds are interleaved; noise is not)."""
    return Stats(
        requests=sum(s.requests for s in rounds),
        errors=sum(s.errors for s in rounds),
        elapsed_s=statistics.median(s.elapsed_s for s in rounds),
        rps=statistics.median(s.rps for s in rounds),
        p50_ms=statistics.median(s.p50_ms for s in rounds),
        p99_ms=statistics.median(s.p99_ms for s in rounds),
    )


@dataclass(frozen=True)
class Ratio:
    """``top / bottom`` per round (paired: measured minutes apart) and their median."""

    per_round: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.per_round)


def ratio(rounds: Rounds, top: str, bottom: str, phase: str, figure: str) -> Ratio:
    pairs = zip(rounds[top][phase], rounds[bottom][phase], strict=True)
    return Ratio([getattr(t, figure) / getattr(b, figure) for t, b in pairs])


def summary(rounds: Rounds) -> dict[str, Any]:
    medians = {
        endpoint: {phase: median_stats(rounds[endpoint][phase]) for phase in PHASES}
        for endpoint in ENDPOINTS
    }
    ratios = {
        phase: {
            "full/claim-floor req/s": ratio(rounds, FULL, CLAIM, phase, "rps"),
            "full/claim-floor p50": ratio(rounds, FULL, CLAIM, phase, "p50_ms"),
            "claim-floor/bare req/s": ratio(rounds, CLAIM, BARE, phase, "rps"),
            "full/bare req/s": ratio(rounds, FULL, BARE, phase, "rps"),
        }
        for phase in PHASES
    }
    targets = [
        {
            "phase": phase,
            "ratio": ratios[phase]["full/claim-floor req/s"].median,
            "target": target,
            "aim": aim,
        }
        for phase, target, aim in TARGETS
    ]
    return {"medians": medians, "ratios": ratios, "targets": targets}


def _verdict(value: float, threshold: float) -> str:
    return "PASS" if value >= threshold else "BELOW"


def render(result: dict[str, Any], config: dict[str, Any]) -> str:
    medians, ratios = result["medians"], result["ratios"]
    lines = [
        f"receive benchmark: {config['requests']} requests per phase, "
        f"{config['concurrency']} client processes, median of {config['rounds']} rounds",
        "",
        f"{'endpoint':<12} {'phase':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}",
    ]
    for endpoint in ENDPOINTS:
        for phase in PHASES:
            s = medians[endpoint][phase]
            lines.append(
                f"{endpoint:<12} {phase:<10} {s.rps:>8.1f} {s.p50_ms:>8.2f} {s.p99_ms:>8.2f}"
                f" {s.errors:>7}"
            )
    lines += ["", "ratios (median of per-round ratios; the rounds in brackets)"]
    for phase in PHASES:
        for name, r in ratios[phase].items():
            spread = " ".join(f"{v:.2f}" for v in r.per_round)
            note = "  (latency: lower is better)" if name.endswith("p50") else ""
            lines.append(f"  {phase:<10} {name:<24} {r.median:>5.2f}  [{spread}]{note}")
    lines += ["", "targets (full / claim-floor req/s)"]
    for t in result["targets"]:
        lines.append(
            f"  {t['phase']:<10} {t['ratio']:.2f}  "
            f"target >= {t['target']:.2f} {_verdict(t['ratio'], t['target']):<5}  "
            f"aim >= {t['aim']:.2f} {_verdict(t['ratio'], t['aim'])}"
        )
    return "\n".join(lines)


def write_json(
    path: Path,
    *,
    config: dict[str, Any],
    rounds: Rounds,
    result: dict[str, Any],
    errors: int,
    error_samples: list[str],
) -> None:
    document = {
        "config": config,
        "medians": {
            e: {p: asdict(s) for p, s in phases.items()} for e, phases in result["medians"].items()
        },
        "rounds": {
            e: {p: [asdict(s) for s in stats] for p, stats in phases.items()}
            for e, phases in rounds.items()
        },
        "ratios": {
            phase: {
                name: {"median": r.median, "per_round": r.per_round} for name, r in named.items()
            }
            for phase, named in result["ratios"].items()
        },
        "targets": result["targets"],
        "errors": errors,
        "error_samples": error_samples,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def write_section(path: Path, config: dict[str, Any], result: dict[str, Any]) -> None:
    """A section's figures (drain, growth) as JSON beside the receive bench's, and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, **result}, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
