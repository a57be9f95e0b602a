"""The one line at the top of the overview and of webhook_status: what is wrong with the
whole (Celery's broker, beat), what could not be read, then every source and every
destination, judged on the one scale of core/states.py. Never OK with a part unread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.translation import ngettext

from ..core.states import Reason, State, worst_state
from .readings import Unread
from .statuses import SourceStatus

# webhook_status's exit code when a part of the status could not be read
UNKNOWN = 3


@dataclass(frozen=True)
class Headline:
    """The one line at the top of the overview and of webhook_status. ``complete``:
    every part was read; a verdict that is not is never OK."""

    state: State
    text: str
    complete: bool = True

    @property
    def label(self) -> str:
        """The state's word, or "unknown" when a part is unread and nothing read is an
        alert."""
        return self.state.label if self.complete or self.state == State.ALERT else "unknown"

    @property
    def exit_code(self) -> int:
        """As monitoring plugins read it: 0 ok, 1 attention, 2 alert, 3 unknown (a part
        unread, and no alert in what was read)."""
        return UNKNOWN if self.label == "unknown" else int(self.state)


def status_verdict(
    statuses: Sequence[SourceStatus],
    destinations: Sequence[Any] = (),
    *,
    system: Sequence[Reason] = (),
    unread: Sequence[Unread] = (),
) -> Headline:
    """ "All 3 sources OK", or the sources that are not, each with its first reason:
    "1 source needs attention: shop — 4 dead letters". The outbox's destinations
    (watch/destinations.py), when there are any, are judged alike after the sources.
    Before them, what is wrong with the whole (``system``: "broker unreachable: …",
    "beat not seen for 2 min"), then what could not be read ("receipts: locked, not
    read within 3 s")."""
    head = [r.summary for r in system]
    if unread:
        head.append("Not read: " + "; ".join(u.text for u in unread))
    rest = _items_verdict(statuses, destinations)
    if not head:
        return rest
    state = max(worst_state(system), rest.state)
    # the items' own line, unless it is only "All … OK", which is not the news here
    tail = [rest.text] if rest.state != State.OK else []
    return Headline(state, ". ".join([*head, *tail]), complete=not unread)


def _items_verdict(statuses: Sequence[SourceStatus], destinations: Sequence[Any]) -> Headline:
    named = [("source", s.source, s) for s in statuses]
    named += [("destination", d.name, d) for d in destinations]
    if not named:
        return Headline(State.OK, "No sources configured")
    worst = max(item.state for _, _, item in named)
    if worst == State.OK:
        if not destinations:
            n = len(statuses)
            return Headline(
                State.OK, f"All {_counted(n, 'source')} OK" if n > 1 else "The source is OK"
            )
        counted = [_count(len(statuses), "source"), _count(len(destinations), "destination")]
        return Headline(State.OK, "All " + " and ".join(c for c in counted if c) + " OK")
    parts = []
    for level in (State.ALERT, State.ATTENTION):
        for kind in ("source", "destination"):
            hit = [(name, item) for k, name, item in named if k == kind and item.state == level]
            if not hit:
                continue
            n = len(hit)
            head = f"{_counted(n, kind)} in alert" if level == State.ALERT else _attention(n, kind)
            parts.append(f"{head}: " + "; ".join(_one_line(name, item) for name, item in hit))
    return Headline(worst, ". ".join(parts))


def _count(n: int, kind: str) -> str:
    return _counted(n, kind) if n else ""


# each phrase whole, for each kind, so that a translation can word it as its language does
def _counted(n: int, kind: str) -> str:
    """ "1 source", "3 destinations"."""
    if kind == "source":
        return ngettext("%d source", "%d sources", n) % n
    return ngettext("%d destination", "%d destinations", n) % n


def _attention(n: int, kind: str) -> str:
    if kind == "source":
        return ngettext("%d source needs attention", "%d sources need attention", n) % n
    return ngettext("%d destination needs attention", "%d destinations need attention", n) % n


def _one_line(name: str, status: Any) -> str:
    first, *rest = status.reasons
    more = f" (+{len(rest)} more)" if rest else ""
    return f"{name} — {first.summary}{more}"
