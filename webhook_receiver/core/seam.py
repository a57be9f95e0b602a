"""The one injection point for what a harness plays itself in place of the production
pieces. A deployment never touches it: the defaults are the production behaviour.

A ``Seam`` holds:

- ``rng``: the generator the retry backoff's full jitter draws from (``core/backoff.py``),
  its own: nothing else draws from it.
- per-process state (``state``): a room's in-memory heuristics, such as the inbound
  claim's storm detector (``inbound/claim.py``, ``DuplicateShare``), one instance each,
  made on first use.

``replaced(rng=)`` puts a fresh seam in place for the length of a ``with`` block,
process-wide (the threads a harness starts see it too), and restores the one before:
the evaluation's simulation (``evaluation/simulation.py``) runs each scenario in one,
with its seeded generator, so a run starts with no state of another and nothing needs
resetting after it. The tests give each test a fresh one the same way
(``tests/conftest.py``). The relay's network, database and clock are its engine's
parameters (``outbound/relay/engine.py``), as they go with one relay.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

T = TypeVar("T")


class Seam:
    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()
        self._state: dict[type[Any], Any] = {}
        self._lock = threading.Lock()

    def state(self, kind: type[T]) -> T:
        """This seam's one ``kind()``, made on first use."""
        found = self._state.get(kind)
        if found is None:
            with self._lock:  # two threads' first use make one
                found = self._state.get(kind)
                if found is None:
                    found = self._state[kind] = kind()
        return cast(T, found)


_current = Seam()


def current() -> Seam:
    """The seam in place: the production one unless a harness replaced it."""
    return _current


@contextmanager
def replaced(*, rng: random.Random | None = None) -> Iterator[Seam]:
    """A fresh seam (this generator, fresh state) in place until the block ends."""
    global _current
    previous, _current = _current, Seam(rng=rng)
    try:
        yield _current
    finally:
        _current = previous
