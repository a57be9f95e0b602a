"""The one retry schedule (``core.backoff``): exponential backoff with full jitter, under
a cap. (The inbound retries' schedule on top of it: tests/inbound/test_failures.py.)"""

from __future__ import annotations

import random

from webhook_receiver.core.backoff import full_jitter


def test_backoff_is_full_jitter_under_a_cap():
    rng = random.Random(7)
    delays = [full_jitter(4, base=2, cap=300, rng=rng) for _ in range(200)]
    assert all(0 <= d <= 16 for d in delays) and max(delays) > 8
    assert all(full_jitter(20, base=2, cap=300, rng=rng) <= 300 for _ in range(50))
