"""Answers take simulated time, as on real processes: a request waits for its answer up
to the destination's timeout, and holds its own slot that long. The harness sees what
the relay's loop does when merchants hang beside a healthy one (docs/eval.md, "Answers
take time"), and fails a relay whose rounds wait for their requests."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from webhook_receiver.evaluation import invariants, scenario
from webhook_receiver.evaluation.measures import percentile
from webhook_receiver.evaluation.observed import Observations
from webhook_receiver.evaluation.simulation import Simulation
from webhook_receiver.outbound.relay.engine import Relay

pytestmark = pytest.mark.django_db(transaction=True)


def noisy_neighbours_in_brief() -> scenario.Scenario:
    """The built-in noisy-neighbours at a fifth of its traffic: 60 orders over a minute,
    three minutes in all. The same merchants tell the same story (the figures below hold
    for both), in a fifth of the time."""
    data = yaml.safe_load((scenario.BUILT_IN / "noisy-neighbours.yaml").read_text())
    data["admissions"][0].update(orders=60, over="1m")
    data["duration"] = "3m"
    return scenario.parse(data)


def p99(obs: Observations, name: str) -> float:
    latencies = [
        m["delivered"] - m["created"]
        for m in obs.messages
        if m["destination"] == name and m["delivered"] is not None
    ]
    value = percentile(latencies, 0.99)
    assert value is not None
    return value


def test_hanging_and_failing_neighbours_leave_the_healthy_one_as_if_alone():
    """Four merchants that never answer and two that answer 503, beside a healthy one:
    each destination is a lane of its own on the relay's loop, and a request that waits
    for its answer holds nothing the healthy one needs."""
    noisy = noisy_neighbours_in_brief()

    beside = Simulation(noisy, seed=1).run()
    alone = Simulation(noisy.only(("healthy",)), seed=1).run()

    assert all(v.held for v in invariants.check(beside, alone))
    assert p99(beside, "healthy") == p99(alone, "healthy") == pytest.approx(0.05)
    # the bad ones were tried meanwhile, their answers taking their time
    assert any(a.outcome == "timeout" for a in beside.arrivals["hanging-1"])


def test_a_relay_whose_rounds_wait_for_their_requests_delays_the_healthy_one(monkeypatch):
    """The planted defect: a round holds the relay's database slot until the requests it
    claimed are answered (as a relay that sent a round's requests inline would). A
    round that claims for a merchant that never answers then holds every destination's
    next round for a timeout, and the healthy merchant's p99 goes from 0.05 s to
    seconds."""
    round_as_it_is = Relay._round

    async def round_waiting_for_its_requests(self, lanes, work):
        before = set(self._tasks)
        await round_as_it_is(self, lanes, work)
        self._rounds += 1
        try:
            await asyncio.gather(*(set(self._tasks) - before), return_exceptions=True)
        finally:
            self._rounds -= 1
            self._changed.set()

    monkeypatch.setattr(Relay, "_round", round_waiting_for_its_requests)
    noisy = noisy_neighbours_in_brief()

    beside = Simulation(noisy, seed=1).run()
    alone = Simulation(noisy.only(("healthy",)), seed=1).run()
    verdicts = {v.name: v for v in invariants.check(beside, alone)}

    assert [n for n, v in verdicts.items() if not v.held] == ["destinations-isolated"]
    assert "to healthy: delivered" in verdicts["destinations-isolated"].first
    assert p99(alone, "healthy") < 0.2
    assert p99(beside, "healthy") > 5


def test_a_slow_answer_takes_its_time_and_a_late_one_is_a_timeout_with_its_effect():
    """A merchant answering in 3 s is delivered 3 s after the request; one answering after
    the 5 s timeout has applied its effect, and the retry is answered from its memory."""
    slow = scenario.parse(
        {
            "name": "slow",
            "duration": "5m",
            "destinations": [
                {
                    "name": "shop",
                    "timeout": "5s",
                    "delay": "3s",
                    "faults": [{"slow": "8s", "attempts": [1], "share": 0.5}],
                }
            ],
            "admissions": [{"orders": 10, "over": "10s"}],
        }
    )

    obs = Simulation(slow, seed=2).run()

    late = [a for a in obs.arrivals["shop"] if a.outcome == "lost"]
    assert late and all(a.answered == pytest.approx(a.at + 5) for a in late)
    on_time = [a for a in obs.arrivals["shop"] if a.outcome == "applied"]
    assert on_time and all(a.answered == pytest.approx(a.at + 3) for a in on_time)
    assert all(m["status"] == "delivered" for m in obs.messages)
    assert sum(obs.merchant_effects["shop"].values()) == 10  # one effect each
    durations = {a["number"]: a for rows in obs.attempts.values() for a in rows}
    assert durations  # every attempt recorded
    assert all(held for held in (v.held for v in invariants.check(obs)))
