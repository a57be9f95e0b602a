"""Reconciliation: what a sender says it sent, against what we hold; a repair list.

What a host uses: the adapter contract (``SenderEvent``, ``SenderUnavailable``) for a
sender of its own, and the business-state hook (``StateComparison`` and its types).
"""

from .adapters import Adapter, SenderEvent, SenderUnavailable
from .states import StateComparison, StateMismatch, SubjectState

__all__ = [
    "Adapter",
    "SenderEvent",
    "SenderUnavailable",
    "StateComparison",
    "StateMismatch",
    "SubjectState",
]
