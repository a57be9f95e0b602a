"""What a destination's limits allow, read off the times its requests started or
arrived: the relay's bench and the multi-node run check the same two things."""

from __future__ import annotations

import math
from collections.abc import Sequence


def bucket_excess(times: Sequence[float], rate: float, burst: int) -> float:
    """The most that any window [t_i, t_j] of sorted ``times`` holds beyond
    rate * (t_j - t_i) + burst: max over j of (j + 1 - rate * t_j) + max over i <= j of
    (rate * t_i - i). At most 0 when a token bucket of ``rate`` and ``burst`` held."""
    worst, best_start = -math.inf, -math.inf
    for j, t in enumerate(times):
        best_start = max(best_start, rate * t - j)
        worst = max(worst, j + 1 - rate * t + best_start)
    return worst - burst if times else 0.0


def worst_window(times: Sequence[float], span: float) -> int:
    """The most of sorted ``times`` in any window of ``span`` seconds."""
    worst, j = 0, 0
    for i in range(len(times)):
        while j < len(times) and times[j] - times[i] < span:
            j += 1
        worst = max(worst, j - i)
    return worst
