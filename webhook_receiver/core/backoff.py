"""The one retry schedule: exponential backoff with full jitter."""

from __future__ import annotations

import random

from . import seam


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, …): uniform in
    [0, min(cap, base * 2 ** (attempt - 1))]. The spread keeps the retries of one outage
    from arriving together. Without ``rng``, the seam's (core/seam.py): a generator of the
    jitter's own (an OpenTelemetry SDK draws its span ids from the ``random`` module's), so
    that a harness can seed it and replay a run."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or seam.current().rng).uniform(0.0, ceiling)
