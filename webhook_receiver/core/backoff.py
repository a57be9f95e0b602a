"""The one retry schedule: exponential backoff with full jitter."""

from __future__ import annotations

import random

# The jitter's own generator: nothing else draws from it (an OpenTelemetry SDK draws its
# span ids from the module's), so the evaluation harness can seed it and replay a run.
jitter = random.Random()


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, …): uniform in
    [0, min(cap, base * 2 ** (attempt - 1))]. The spread keeps the retries of one outage
    from arriving together."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return (rng or jitter).uniform(0.0, ceiling)
