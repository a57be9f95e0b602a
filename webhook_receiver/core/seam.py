"""The one injection point for what a harness plays itself in place of the production
pieces. A deployment never touches it: the defaults are the production behaviour.

A ``Seam`` holds ``rng``: the generator the retry backoff's full jitter draws from
(``core/backoff.py``), its own: nothing else draws from it.

``replaced(rng=)`` puts a fresh seam in place for the length of a ``with`` block,
process-wide (the threads a harness starts see it too), and restores the one before:
the evaluation's simulation (``evaluation/simulation.py``) runs each scenario in one,
with its seeded generator, so a run draws nothing another drew. The tests give each
test a fresh one the same way (``tests/conftest.py``). The relay's network, database
and clock are its engine's parameters (``outbound/relay/engine.py``), as they go with
one relay.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager


class Seam:
    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random()


_current = Seam()


def current() -> Seam:
    """The seam in place: the production one unless a harness replaced it."""
    return _current


@contextmanager
def replaced(*, rng: random.Random | None = None) -> Iterator[Seam]:
    """A fresh seam (this generator) in place until the block ends."""
    global _current
    previous, _current = _current, Seam(rng=rng)
    try:
        yield _current
    finally:
        _current = previous
