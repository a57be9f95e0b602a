"""The levels of a source's or a destination's state, and the reasons that make it so:
one scale for the overview, webhook_status and the verdict at their top."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class State(IntEnum):
    """Ordered, so that a source's state is its worst condition's."""

    OK = 0
    ATTENTION = 1
    ALERT = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Reason:
    """One condition that makes a source not ok: a stable code, its level, a few words
    for the verdict ("silent for 42 min") and the sentence with the detail."""

    code: str
    state: State
    summary: str
    text: str

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "state": self.state.label,
            "summary": self.summary,
            "text": self.text,
        }


def worst_state(reasons: Iterable[Reason]) -> State:
    """The state of whatever has these reasons: its worst one's (OK with none)."""
    return max((r.state for r in reasons), default=State.OK)
