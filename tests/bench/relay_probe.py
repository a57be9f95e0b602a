"""``manage.py webhook_relay`` with its rounds timed and its event loop's lag sampled, for
the relay bench's profiled run (``python -m tests.bench.relay_probe``; the bench sets
DJANGO_SETTINGS_MODULE and BENCH_RELAY_PROBE_OUTPUT).

The same command in the same process, with two additions that cost little beside it:
each round (``relay_round_or_apart``, on a database thread) timed on CLOCK_MONOTONIC
with its destinations, answers and claims; and a task that sleeps 10 ms at a time and
records how late it wakes (the loop's lag: how long a callback waited for the loop, the
interpreter lock included). Both are written as JSON to BENCH_RELAY_PROBE_OUTPUT when the
relay stops (SIGTERM).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import time
from typing import Any

LAG_TICK_SECONDS = 0.01


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from webhook_receiver.outbound.relay import engine, process

    rounds: list[tuple[float, float, int, int, int, int]] = []
    lags: list[tuple[float, float]] = []
    round_or_apart = engine.relay_round_or_apart

    def timed(work: Any, *, rows: Any = None) -> Any:
        started = time.monotonic()
        outcomes = round_or_apart(work, rows=rows)
        rounds.append(
            (
                started,
                time.monotonic(),
                len(work),
                sum(len(w.answers) for w in work),
                sum(w.claim for w in work),
                sum(len(o.claimed) for o in outcomes.values()),
            )
        )
        return outcomes

    serve = process._serve

    async def served(relay: Any, listen_to: Any) -> None:
        async def lag() -> None:
            while True:
                at = time.monotonic()
                await asyncio.sleep(LAG_TICK_SECONDS)
                lags.append((at, time.monotonic() - at - LAG_TICK_SECONDS))

        task = asyncio.ensure_future(lag())
        try:
            await serve(relay, listen_to)
        finally:
            task.cancel()

    def written() -> None:
        with open(os.environ["BENCH_RELAY_PROBE_OUTPUT"], "w") as file:
            json.dump({"rounds": rounds, "lags": lags}, file)

    engine.relay_round_or_apart = timed  # type: ignore[assignment]
    process._serve = served  # type: ignore[assignment]
    atexit.register(written)
    call_command("webhook_relay")


if __name__ == "__main__":
    main()
