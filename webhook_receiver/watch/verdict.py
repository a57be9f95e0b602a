"""The one line at the top of the overview and of webhook_status: every source, then
every destination, judged on the one scale of core/states.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.states import State
from ..core.words import plural
from .sources import SourceStatus


@dataclass(frozen=True)
class Verdict:
    """The one line at the top of the overview and of webhook_status."""

    state: State
    text: str


def status_verdict(statuses: Sequence[SourceStatus], destinations: Sequence[Any] = ()) -> Verdict:
    """ "All 3 sources OK", or the sources that are not, each with its first reason:
    "1 source needs attention: shop — 4 dead letters". The outbox's destinations
    (watch/destinations.py), when there are any, are judged alike after the sources."""
    named = [("source", s.source, s) for s in statuses]
    named += [("destination", d.name, d) for d in destinations]
    if not named:
        return Verdict(State.OK, "No sources configured")
    worst = max(item.state for _, _, item in named)
    if worst == State.OK:
        if not destinations:
            n = len(statuses)
            return Verdict(
                State.OK, f"All {n} source{plural(n)} OK" if n > 1 else "The source is OK"
            )
        counted = [_count(len(statuses), "source"), _count(len(destinations), "destination")]
        return Verdict(State.OK, "All " + " and ".join(c for c in counted if c) + " OK")
    parts = []
    for level in (State.ALERT, State.ATTENTION):
        for kind in ("source", "destination"):
            hit = [(name, item) for k, name, item in named if k == kind and item.state == level]
            if not hit:
                continue
            n = len(hit)
            head = (
                f"{n} {kind}{plural(n)} in alert"
                if level == State.ALERT
                else f"{n} {kind}{' needs' if n == 1 else 's need'} attention"
            )
            parts.append(f"{head}: " + "; ".join(_one_line(name, item) for name, item in hit))
    return Verdict(worst, ". ".join(parts))


def _count(n: int, kind: str) -> str:
    return f"{n} {kind}{plural(n)}" if n else ""


def _one_line(name: str, status: Any) -> str:
    first, *rest = status.reasons
    more = f" (+{len(rest)} more)" if rest else ""
    return f"{name} — {first.summary}{more}"
