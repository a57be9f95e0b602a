"""The invariants of what an answer means, held to what docs/sending.md promises (and the
seed: "permanent authentication or payload rejection belongs in a terminal state for
operator review, not an endless retry loop"): a permanent answer is final, the breaker
limits attempts to one probe per cool-down, a Retry-After is waited up to its cap, and
nothing is tried past its retry budget. Each is counted at the merchant and in the
database, never from the relay's own account of itself."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.utils.translation import ngettext

from .observed import INF, RunView, invariant, when

# Written here apart from the relay's own policy (relay/policy.py), so that a change
# there is held to the promise:
# answers no retry changes, for an operator (the seed: "permanent authentication or
# payload rejection belongs in a terminal state for operator review")
PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 422})
# the endpoint is gone (the Standard Webhooks advice): its destination is disabled and
# its messages held, neither failed nor sent, until an operator enables it
GONE = 410
# answers that pace us when they carry a Retry-After: deferred, spending no budget
PACING_STATUSES = frozenset({429, 503})
# a merchant's outcomes that are a 2xx
SUCCESSES = frozenset({"applied", "duplicate"})


@invariant(
    "terminal-answer-final",
    "a permanent answer ends its message: no later attempt, terminal with its reason",
)
def terminal_answer_final(v: RunView) -> tuple[int, str]:
    """A permanent answer (400, 401, 403, 404, 422) ends its message at that
    attempt: no later request of that key reaches the merchant, and the message is
    terminal with that answer as its reason. A recovery job that released the message
    (an operator's decision) starts it afresh: each part, before and after, is held to
    it, the message's state to the last part's."""
    count = 0
    by_key = {(m["destination"], m["key"]): m for m in v.obs.messages}
    for (name, event), arrivals in sorted(v.arrivals_of.items()):
        parts = [arrivals]
        if (name, event) in v.released:
            released = v.released[(name, event)]
            parts = [
                [a for a in arrivals if a.at < released],
                [a for a in arrivals if a.at >= released],
            ]
        m = by_key.get((name, event))
        for i, part in enumerate(parts):
            final = next((a for a in part if a.status in PERMANENT_STATUSES), None)
            if final is None:
                continue
            count += 1
            later = [a for a in part if a.seq > final.seq]
            problem = ""
            if later:
                problem = (
                    ngettext("%d later request", "%d later requests", len(later)) % len(later)
                    + f", the first at {when(later[0].at)}"
                )
            elif i < len(parts) - 1:
                continue  # released by a recovery since: the message's state is not this one's
            elif m is None or m["status"] != "failed":
                problem = f"the message is {m['status'] if m else 'missing'}, not terminal"
            elif m["last_status_code"] != final.status:
                reason = m["last_status_code"] or m["last_error"] or "none"
                problem = f"terminal with the reason {reason!r}, not {final.status}"
            if problem:
                return (
                    count,
                    f"{event} at {name}: answered {final.status} at {when(final.at)}; {problem}",
                )
    return count, ""


def _breaker_failure(a: Any) -> bool | None:
    """What an answer is to the breaker (docs/sending.md): True a failure, False a
    success, None neither (a permanent answer, or a 429 that paces us)."""
    if a.outcome in SUCCESSES:
        return False
    if a.status in PERMANENT_STATUSES or a.status == GONE:
        return None
    if a.status == 429 and a.retry_after is not None:
        return None
    return True


@invariant(
    "breaker-limits-attempts",
    "after breaker_threshold failures in a row, one probe per cool-down until a success",
)
def breaker_limits_attempts(v: RunView) -> tuple[int, str]:
    """Counted at the merchant: once ``breaker_threshold`` consecutive failures have
    been answered, at most one request is started per cool-down (a probe, started no
    sooner than a cool-down after the last failure was answered) until one succeeds.
    Requests started together (one round) are answered together, as the breaker counts
    them; requests already on their way when it opened are not held to it. A recovery
    job ends the pause as it starts (an operator's decision): a probe may start then."""
    count = 0
    specs = {d.name: d for d in v.obs.scenario.destinations}
    for name, arrivals in sorted(v.obs.arrivals.items()):
        spec = specs[name]
        rounds: dict[int, list[Any]] = defaultdict(list)
        for a in arrivals:
            rounds[a.round].append(a)
        streak = 0
        opened_at: float | None = None  # when the breaker opened (None: closed)
        opened_by = 0  # the round whose answers opened it
        free_at = -INF  # the earliest a probe may start
        # in the order the relay recorded them: when their last answer came
        for number, batch in sorted(
            rounds.items(), key=lambda r: (max(a.answered for a in r[1]), r[0])
        ):
            count += len(batch)
            at = batch[0].at
            answered = max(a.answered for a in batch)
            if opened_at is not None:
                ended = [t for t in v.recovered_at.get(name, ()) if opened_at <= t <= at]
                free_at = min([free_at, *ended])
            early = at < free_at - 1e-6
            # a round sent after the breaker opened (at its instant: sent after it)
            held_to_it = opened_at is not None and (
                at > opened_at + 1e-6 or (at > opened_at - 1e-6 and number > opened_by)
            )
            if held_to_it and (early or len(batch) > 1):
                what = (
                    f"no probe due before {when(free_at)}"
                    if early
                    else f"{len(batch)} probes at once"
                )
                return (
                    count,
                    f"{name}: {batch[0].event} started {when(at)}, with the breaker open since "
                    f"{when(opened_at)} after {streak} failures in a row: {what}",
                )
            kinds = [_breaker_failure(a) for a in batch]
            if False in kinds:
                streak, opened_at, free_at = 0, None, -INF
                continue
            streak += sum(k is True for k in kinds)
            if streak >= spec.breaker_threshold and True in kinds:
                if opened_at is None:
                    opened_at, opened_by = answered, number
                free_at = max(free_at, answered + spec.breaker_cooldown_seconds)
    return count, ""


@invariant("retry-after-capped", "a Retry-After is waited as asked, up to the cap, never past it")
def retry_after_capped(v: RunView) -> tuple[int, str]:
    """A 429 or 503 with a Retry-After is waited as asked up to the destination's cap,
    and no longer: its next attempt is set at least min(asked, cap) after the request
    started, and no more than that past its answer (the request's deadline at most)."""
    count = 0
    specs = {d.name: d for d in v.obs.scenario.destinations}
    # what the merchant asked for, by the request's start (the attempt's started_at)
    asked: dict[tuple[str, str, float], float] = {}
    for (name, event), arrivals in v.arrivals_of.items():
        for a in arrivals:
            if a.status in PACING_STATUSES and a.retry_after is not None:
                asked[(name, event, a.at)] = a.retry_after
    for m in v.obs.messages:
        spec = specs[m["destination"]]
        for attempt in v.obs.attempts.get(m["id"], []):
            wait = asked.get((m["destination"], m["key"], attempt["started"]))
            if wait is None or attempt["status_code"] not in PACING_STATUSES:
                continue
            count += 1
            expected = min(wait, spec.retry_after_cap_seconds)
            waited = None if attempt["next"] is None else attempt["next"] - attempt["started"]
            if waited is None or not (
                expected - 1e-6 <= waited <= expected + spec.timeout_seconds + 1e-6
            ):
                return (
                    count,
                    f"{m['key']} to {m['destination']}: attempt {attempt['number']} at "
                    f"{when(attempt['started'])} asked to wait {wait:g} s (the cap "
                    f"{spec.retry_after_cap_seconds:g} s); the next attempt was set "
                    + ("never" if waited is None else f"{waited:g} s later"),
                )
    return count, ""


@invariant(
    "budget-respected",
    "no message is tried past its retry budget (max_attempts), counted at the merchant",
)
def budget_respected(v: RunView) -> tuple[int, str]:
    """No message is tried past its retry budget: at the merchant, at most
    ``max_attempts`` requests of a key got an answer that spends it (anything but a 2xx,
    a permanent answer, or a Retry-After that paces us); a recovery job that released it
    gave it a budget afresh, counted from the job's start."""
    count = 0
    specs = {d.name: d for d in v.obs.scenario.destinations}
    for (name, event), arrivals in sorted(v.arrivals_of.items()):
        count += 1
        budget = specs[name].max_attempts
        spent = [
            a
            for a in arrivals
            if a.outcome not in SUCCESSES
            and a.status not in PERMANENT_STATUSES
            and not (a.status in PACING_STATUSES and a.retry_after is not None)
        ]
        released = v.released.get((name, event), INF)
        for part in ([a for a in spent if a.at < released], [a for a in spent if a.at >= released]):
            if len(part) > budget:
                return (
                    count,
                    f"{event} at {name}: {len(part)} failed requests against a budget of "
                    f"{budget}, the one past it at {when(part[budget].at)}",
                )
    return count, ""


@invariant(
    "gone-holds", "a 410 disables its destination: nothing failed or sent until enabled, then all"
)
def gone_holds(v: RunView) -> tuple[int, str]:
    """After a 410 Gone, counted at the merchant and in the database: no request of its
    destination arrives from that answer until an operator enables it (requests already
    on their way are not held to it), no message of it is failed for the 410, and once
    it is enabled (and answers no 410 again) every one of its messages is delivered; their
    order is fifo-per-destination's and order-within-key's to check."""
    count = 0
    enables: dict[str, list[float]] = defaultdict(list)
    for e in v.obs.enables:
        enables[e["destination"]].append(e["at"])
    for name, arrivals in sorted(v.obs.arrivals.items()):
        gone = [a for a in arrivals if a.status == GONE]
        if not gone:
            continue
        count += 1
        problem = ""
        for g in gone:
            enabled_at = min((t for t in enables[name] if t >= g.answered), default=INF)
            sent = [a for a in arrivals if g.answered + 1e-6 < a.at < enabled_at]
            if sent:
                problem = (
                    f"answered 410 at {when(g.answered)}, then {sent[0].event} arrived at "
                    f"{when(sent[0].at)}, before it was enabled ({when(enabled_at)})"
                )
                break
        messages = v.by_dest.get(name, [])
        failed = [m for m in messages if m["status"] == "failed" and m["last_status_code"] == GONE]
        if not problem and failed:
            problem = f"{failed[0]['key']} failed for a 410 instead of being held"
        last_gone = gone[-1].answered
        if not problem and any(t >= last_gone for t in enables[name]):
            undelivered = [m for m in messages if m["status"] != "delivered"]
            if undelivered:
                m = undelivered[0]
                problem = (
                    f"enabled after its last 410 ({when(last_gone)}), yet {m['key']} is "
                    f"{m['status']} at the cut-off"
                )
        if problem:
            return count, f"{name}: {problem}"
    return count, ""
