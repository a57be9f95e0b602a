"""Business state in reconciliation: the host's hook.

Reconciliation owns no business state. To compare the state the sender's events set
(an order paid at version 3) with the host's, it asks the host, through a
``StateComparison`` subclass named in ``WEBHOOK_RECEIVER["STATE_COMPARISON"]``:

- ``state_of(event)``: the subject and state that one of the sender's listed events
  sets, or None. Reconciliation keeps the latest (highest version) per subject.
- ``compare(source=…, states=…)``: for a batch of subjects, those whose state the host
  holds differently (or not at all). Each becomes a ``state_mismatch`` repair item.

The demo shop's (project/shop/reconcile.py) reads ``order.*`` events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..core.hooks import hook_class
from .adapters import SenderEvent


@dataclass(frozen=True)
class SubjectState:
    """A subject's state as a sender's event sets it. A host's ``state_of`` gives the first
    three; reconciliation adds the event that set it."""

    subject: str  # the business object: an order id, an invoice number…
    state: str  # paid, cancelled…
    version: int  # states only move forward in version
    event_key: str = ""
    event_type: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True)
class StateMismatch:
    """A subject whose state the host holds differently from the sender's latest."""

    subject: str
    sender_says: Mapping[str, Any]
    we_hold: Mapping[str, Any]  # empty when the host holds nothing for the subject


class StateComparison:
    """Subclass it, implement both methods, and name it in STATE_COMPARISON. Made with no
    arguments for each run."""

    def state_of(self, event: SenderEvent) -> SubjectState | None:
        """The subject, state and version that ``event`` (as the sender lists it) sets, or
        None when it sets none this host compares."""
        return None

    def compare(
        self, *, source: str, states: Mapping[str, SubjectState]
    ) -> Iterable[StateMismatch]:
        """Of ``states`` (subject -> the sender's latest, a batch of at most a few
        hundred), those whose state the host holds differently, or not at all."""
        return ()


def state_comparison(path: str | None) -> StateComparison | None:
    """The StateComparison that STATE_COMPARISON names, made; None when it names none.
    Raises ``ImproperlyConfigured`` for anything else (system check E004)."""
    if not path:
        return None
    expected = "a subclass of webhook_receiver.reconcile.states.StateComparison"
    return hook_class(path, StateComparison, setting="STATE_COMPARISON", expected=expected)()
