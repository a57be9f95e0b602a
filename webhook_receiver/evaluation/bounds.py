"""The work a scenario may ask for, counted before anything is built: a file of a few
lines must not ask for a run that never ends, nor for more memory than a machine has.

On two cores with PostgreSQL an admission costs 8 to 14 ms and keeps about 3.5 KB until
the report (its row, its attempts, the merchant's arrivals), a sender's post about 3 ms,
a beat tick about 1 ms; the samples are a fixed number (simulation.SAMPLES). Shares are
counted as if they were 1: a bound holds whatever the seed picks. The isolation
counterfactual runs the isolated destinations' part once more. docs/eval.md ("Bounds")
states the same for a scenario's author.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .reading import refusal

if TYPE_CHECKING:
    from .inputs import Scenario

# admissions (orders × events × destinations × (1 + repeats)): about an hour and a
# gigabyte; forty times the largest built-in scenario's (flash-sale: 6,000)
MAX_ADMISSIONS = 250_000
# a sender's posts, first deliveries and redeliveries: about a quarter of an hour
MAX_INBOUND_POSTS = 250_000
# requests to the merchants if every attempt failed: the largest run's admissions each
# spending the default retry budget (12 attempts)
MAX_REQUESTS = 12 * MAX_ADMISSIONS
# beat's runs in all (relay sweep, retry sweep, silence check): a 31-day run with the
# relay sweep every second and the others as deployed, in under an hour
MAX_BEAT_TICKS = 3_000_000
# destinations: each is a merchant, sampled SAMPLES times; the built-in ones have three
MAX_DESTINATIONS = 100
# entries of any other list (faults, a fault's attempts and events, repeats, crashes,
# silent windows): each is looked through on every request, admission or post
MAX_ENTRIES = 1_000
# a destination's whole numbers are PositiveIntegerField columns: 32 bits on PostgreSQL
MAX_COLUMN_INTEGER = 2**31 - 1
# a request's deadline: one longer than the longest run never ends within it
MAX_TIMEOUT = 31 * 86400
# the simulated clock counts from 1970, and every date the relay computes must stay a date
EARLIEST_START = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_START = datetime(2100, 1, 1, tzinfo=UTC)


def check_work(scenario: Scenario) -> None:
    """Refuse a scenario whose run would be too large (admissions, a sender's posts,
    requests, beat ticks, list lengths) or could not be held (a column's integer, a
    date), naming the place, the count it asks for and the bound."""
    s = scenario
    if len(s.destinations) > MAX_DESTINATIONS:
        raise refusal(
            "destinations",
            f"{len(s.destinations):,} destinations; a run takes at most {MAX_DESTINATIONS} "
            "(each is a merchant, sampled through the run): model merchants by kind",
        )
    lists: list[tuple[str, tuple[Any, ...]]] = [("crashes", s.crashes)]
    for i, d in enumerate(s.destinations):
        lists.append((f"destinations[{i}].faults", d.faults))
        for j, f in enumerate(d.faults):
            lists.append((f"destinations[{i}].faults[{j}].attempts", f.attempts))
            lists.append((f"destinations[{i}].faults[{j}].events", f.events))
    for i, a in enumerate(s.admissions):
        lists.append((f"admissions[{i}].events", a.events))
        lists.append((f"admissions[{i}].repeat", a.repeats))
    if s.inbound is not None:
        lists.append(("inbound.silent", s.inbound.silent))
    for at, entries in lists:
        if len(entries) > MAX_ENTRIES:
            raise refusal(
                at,
                f"{len(entries):,} entries; a list takes at most {MAX_ENTRIES:,} (each is "
                "looked through on every request, admission or post)",
            )

    if not EARLIEST_START <= s.start < LATEST_START:
        raise refusal(
            "start",
            f"{s.start.isoformat()}: write a time from {EARLIEST_START.year} to "
            f"{LATEST_START.year - 1} (the simulated clock counts from 1970)",
        )
    for i, d in enumerate(s.destinations):
        for key, value in (
            ("rate", d.rate_count),
            ("burst", d.burst),
            ("max_in_flight", d.max_in_flight),
            ("max_attempts", d.max_attempts),
            ("breaker_threshold", d.breaker_threshold),
        ):
            if value > MAX_COLUMN_INTEGER:
                raise refusal(
                    f"destinations[{i}].{key}",
                    f"{_figure(value)} is more than a destination's column holds "
                    f"({MAX_COLUMN_INTEGER:,})",
                )
        if d.timeout_seconds > MAX_TIMEOUT:
            raise refusal(
                f"destinations[{i}].timeout",
                f"at most {MAX_TIMEOUT // 86400} days: a longer deadline never ends in a run",
            )
    for i, a in enumerate(s.admissions):
        _check_metadata(a.metadata, f"admissions[{i}].metadata")

    # admissions, per entry and in all, and per destination for the requests below
    per_destination = dict.fromkeys(s.names(), 0)
    total = 0
    for i, a in enumerate(s.admissions):
        targets = a.destinations or s.names()
        # each repeat may admit every key once more
        per_target = a.orders * len(a.events) * (1 + len(a.repeats))
        count = per_target * len(targets)
        if count > MAX_ADMISSIONS:
            repeats = f" × (1 + {_of(len(a.repeats), 'repeat')})" if a.repeats else ""
            raise refusal(
                f"admissions[{i}].orders",
                f"{_of(a.orders, 'order')} × {_of(len(a.events), 'event')} × "
                f"{_of(len(targets), 'destination')}{repeats} asks for {_figure(count)} "
                f"admissions; a run takes at most {MAX_ADMISSIONS:,} (about an hour and a "
                "gigabyte): admit fewer orders, or split the run",
            )
        total += count
        for name in targets:
            per_destination[name] += per_target
    if total > MAX_ADMISSIONS:
        raise refusal(
            "admissions",
            f"{_of(len(s.admissions), 'entry', 'entries')} ask for {_figure(total)} "
            f"admissions in all; a run takes at most {MAX_ADMISSIONS:,} (about an hour and a "
            "gigabyte): admit fewer orders, or split the run",
        )

    # requests if every attempt failed: each message spends its budget, within the
    # limiter's allowance over the run (rate × duration + burst)
    requests = []
    for d in s.destinations:
        allowance = d.burst + d.rate_count * s.duration / d.rate_seconds
        requests.append(min(per_destination[d.name] * d.max_attempts, allowance))
    if sum(requests) > MAX_REQUESTS:
        i = max(range(len(requests)), key=requests.__getitem__)
        d = s.destinations[i]
        raise refusal(
            f"destinations[{i}].max_attempts",
            f"{_of(per_destination[d.name], 'admission')} × {d.max_attempts:,} attempts may "
            f"make {_figure(requests[i])} requests if every attempt fails "
            f"({_figure(sum(requests))} in all); a run takes at most {MAX_REQUESTS:,}: "
            "give a smaller retry budget, or admit fewer orders",
        )

    if s.inbound is not None:
        first = s.inbound.events
        # a redelivery per event, at most
        posts = first * (2 if s.inbound.duplicates.share > 0 else 1)
        if posts > MAX_INBOUND_POSTS:
            again = " and as many redeliveries" if posts > first else ""
            raise refusal(
                "inbound.events",
                f"{_of(first, 'event')}{again} ask for {_figure(posts)} posts; a run takes "
                f"at most {MAX_INBOUND_POSTS:,} (about a quarter of an hour): send fewer",
            )

    # beat's tasks, and each relay's poll, run from the start to the cut-off at their
    # intervals
    tasks: list[tuple[str, float, float]] = []
    if s.destinations:
        tasks.append(("relay.poll", s.relay.poll, s.relay.processes))
    if s.inbound is not None:
        tasks += [
            ("beat.retry_sweep", s.beat.retry_sweep, 1),
            ("beat.silence_check", s.beat.silence_check, 1),
        ]
    ticks = {name: (s.duration / interval + 1) * times for name, interval, times in tasks}
    every = {name: interval for name, interval, _ in tasks}
    if sum(ticks.values()) > MAX_BEAT_TICKS:
        name = max(ticks, key=ticks.__getitem__)
        raise refusal(
            name,
            f"every {every[name]:g} s for {_span(s.duration)} asks for "
            f"{_figure(ticks[name])} runs ({_figure(sum(ticks.values()))} ticks in all); "
            f"a run takes at most {MAX_BEAT_TICKS:,} (31 days of a relay's poll every "
            "second): give it a longer interval, or the run a shorter duration",
        )


def _check_metadata(metadata: dict[str, Any], at: str) -> None:
    """Admission's own rule for metadata (a small JSON object), before the run rather
    than at its first admission."""
    # imported here: reading the format needs no app registry, admission its models
    from ..outbound.admission import _checked_metadata

    try:
        _checked_metadata(metadata)
    except ValueError as exc:
        raise refusal(at, str(exc)) from None


def _of(count: int, noun: str, nouns: str = "") -> str:
    return f"{_figure(count)} {noun if count == 1 else nouns or noun + 's'}"


def _figure(count: float) -> str:
    """A count as an error shows it (1,234,567); an absurd one by its magnitude."""
    if count < 10**15:
        return f"{int(count):,}"
    if count == float("inf"):
        return "more than 10^308"
    return f"about 10^{int(math.log10(count))}"


def _span(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds / size
            return f"{count:g} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} s"
