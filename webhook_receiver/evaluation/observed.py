"""What one run left (``Observations``), and how the invariants read it: an ``InvariantResult``
per invariant (``invariant`` makes a check's), simulated times in words, and the
observations indexed by destination, message and key (``RunView``)."""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec

from . import world
from .inputs import Scenario

INF = math.inf
P = ParamSpec("P")


@dataclass
class Observations:
    """What one run left: the scheduled admissions, the database's rows at the cut-off,
    each merchant's arrivals and effects, the receiver's side, and the samples."""

    scenario: Scenario
    seed: int
    cut_off: float
    admissions: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    arrivals: dict[str, list[world.Arrival]] = field(default_factory=dict)
    merchant_effects: dict[str, Counter[str]] = field(default_factory=dict)
    max_concurrency: dict[str, int] = field(default_factory=dict)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    inbound_sent: list[dict[str, Any]] = field(default_factory=list)
    inbound_effects: Counter[str] = field(default_factory=Counter)
    inbound_failed: dict[str, str] = field(default_factory=dict)
    silence: list[dict[str, Any]] = field(default_factory=list)
    # (at, open messages, oldest eligible age, held back, longest held), per destination
    samples: dict[str, list[tuple[float, int, float, int, float]]] = field(default_factory=dict)
    # at the same moments, per destination: what the status judged its backlog
    # ("relay_not_sending", "behind", or "" for neither)
    judged: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # at the cut-off: per destination, each terminal message that holds later ones of
    # its ordering key back, with how many and since when
    held_back: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    statements: Counter[str] = field(default_factory=Counter)
    # an operator enabling a destination: {at, destination, held}
    enables: list[dict[str, Any]] = field(default_factory=list)
    # an operator starting a recovery job (recoveries.py): {at, destination, kind, job,
    # planned, rate, refused}, and at the cut-off {state, released, finished}
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class InvariantResult:
    name: str
    title: str
    held: bool
    checked: int
    first: str = ""  # the first event that broke it, in words
    # the ledger: a run that does not balance proves nothing
    voids: bool = False


def invariant(
    name: str, title: str, *, voids: bool = False
) -> Callable[[Callable[P, tuple[int, str]]], Callable[P, InvariantResult]]:
    """A check of the invariant ``name``, from a function that returns how many things it
    checked and the first that broke it, in words ("": it held). ``voids``: broken, it
    voids the run."""

    def verdict_of(check: Callable[P, tuple[int, str]]) -> Callable[P, InvariantResult]:
        @functools.wraps(check)
        def verdict(*args: P.args, **kwargs: P.kwargs) -> InvariantResult:
            checked, first = check(*args, **kwargs)
            held = not first
            return InvariantResult(name, title, held, checked, first, voids=voids and not held)

        return verdict

    return verdict_of


def over_rate(
    times: list[float], rate: float, allowance: float
) -> tuple[int, tuple[int, int] | None]:
    """The first span of ``times`` (sorted seconds) holding more than rate × its length
    + ``allowance`` of them: (how many times were looked at, the span's first and last
    index, or None). Times are to the microsecond: the bound allows for that much."""
    best, best_i = -INF, 0
    for j, t in enumerate(times):
        if rate * t - j > best:
            best, best_i = rate * t - j, j
        if (j + 1 - rate * t) + best > allowance + 1e-6 + rate * 1e-6:
            return j + 1, (best_i, j)
    return len(times), None


def when(seconds: float | None) -> str:
    """Simulated time since the start, as +HH:MM:SS(.fff)."""
    if seconds is None or seconds == INF:
        return "never"
    whole = int(seconds)
    text = f"+{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    frac = round(seconds - whole, 3)
    return f"{text}.{int(frac * 1000):03d}" if frac else text


class RunView:
    """The observations indexed the way the checks read them."""

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        self.by_dest: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for m in obs.messages:
            self.by_dest[m["destination"]].append(m)
        # the claims that were never recorded (a relay that crashed)
        crashed: dict[tuple[str, str], list[float]] = defaultdict(list)
        for c in obs.crashes:
            for key in c["keys"]:
                crashed[(c["destination"], key)].append(c["at"])
        self.first_attempt: dict[int, float] = {}
        for m in obs.messages:
            starts = [a["started"] for a in obs.attempts.get(m["id"], [])]
            starts += crashed.get((m["destination"], m["key"]), [])
            self.first_attempt[m["id"]] = min(starts) if starts else INF
        # a recovery job's start, per message it released, and per destination (each
        # start ends an open breaker's pause)
        jobs = {j["job"]: j["at"] for j in obs.recoveries if j["job"] is not None}
        self.released: dict[tuple[str, str], float] = {
            (m["destination"], m["key"]): jobs[m["recovery_id"]]
            for m in obs.messages
            if m.get("recovery_id") in jobs
        }
        self.recovered_at: dict[str, list[float]] = defaultdict(list)
        for j in obs.recoveries:
            if j["job"] is not None:
                self.recovered_at[j["destination"]].append(j["at"])
        self.arrivals_of: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for name, arrivals in obs.arrivals.items():
            for a in arrivals:
                self.arrivals_of[(name, a.event)].append(a)

    def delivered_seq(self, m: dict[str, Any]) -> int | None:
        """The merchant's arrival that delivered ``m`` (its last 2xx)."""
        ok = [
            a.seq
            for a in self.arrivals_of[(m["destination"], m["key"])]
            if a.outcome in ("applied", "duplicate")
        ]
        return ok[-1] if ok else None
