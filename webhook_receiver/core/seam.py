"""The one injection point for what a harness plays itself in place of the production
pieces. A deployment never touches it: the defaults are the production behaviour.

A ``Seam`` holds:

- ``relay``: how a relay run of destination D is started, now (countdown None) or after a
  countdown in seconds. None, the default, queues the Celery task
  ``webhook_receiver.relay_destination`` (``outbound/trigger.py``, every trigger).
- ``rng``: the generator the retry backoff's full jitter draws from (``core/backoff.py``),
  its own: nothing else draws from it.
- per-process state (``state``): a room's in-memory heuristics, such as the inbound
  claim's storm detector (``inbound/claim.py``, ``DuplicateShare``), one instance each,
  made on first use.

``replaced(relay=, rng=)`` puts a fresh seam in place for the length of a ``with`` block,
process-wide (the threads a harness starts see it too), and restores the one before:
the evaluation's simulation (``evaluation/simulation.py``) runs each scenario in one,
with its schedule for the broker and its seeded generator, so a run starts with no
state of another and nothing needs resetting after it. The tests give each test a fresh
one the same way (``tests/conftest.py``). The relay's transport and clock are
``relay_run``'s parameters (``outbound/relay/run.py``), as they go with one run.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

T = TypeVar("T")

# start a relay run of the destination, after the countdown (seconds) or now (None)
RelayStart = Callable[[int, float | None], None]


class Seam:
    def __init__(
        self, *, relay: RelayStart | None = None, rng: random.Random | None = None
    ) -> None:
        self.relay = relay
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
def replaced(
    *, relay: RelayStart | None = None, rng: random.Random | None = None
) -> Iterator[Seam]:
    """A fresh seam (these pieces, fresh state) in place until the block ends."""
    global _current
    previous, _current = _current, Seam(relay=relay, rng=rng)
    try:
        yield _current
    finally:
        _current = previous
