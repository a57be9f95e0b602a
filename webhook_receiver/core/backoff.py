"""The one retry schedule: exponential backoff with full jitter."""

from __future__ import annotations

import random


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, …): uniform in
    [0, min(cap, base * 2 ** (attempt - 1))]. The spread keeps the retries of one outage
    from arriving together."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0.0, ceiling)
