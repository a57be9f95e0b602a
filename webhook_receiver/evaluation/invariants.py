"""The invariants checked after every run, each a function of what the run left
(``Observations``), each naming the first event that broke it.

They are read at the merchant (what a destination actually received, and when) and in
the database (what the app recorded), never from the app's own claims about itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from .answers import (
    SUCCESSES,
    breaker_limits_attempts,
    budget_respected,
    gone_holds,
    retry_after_capped,
    terminal_answer_final,
)
from .observed import INF, InvariantResult, Observations, RunView, invariant, over_rate, when
from .recoveries import recovery_within_rate


@invariant("one-message-per-event", "one durable message per logical event and destination")
def one_message_per_event(v: RunView) -> tuple[int, str]:
    admitted = {(a["destination"], a["key"]) for a in v.obs.admissions}
    created = Counter((a["destination"], a["key"]) for a in v.obs.admissions if a["created"])
    rows = Counter((m["destination"], m["key"]) for m in v.obs.messages)
    for a in v.obs.admissions:
        pair = (a["destination"], a["key"])
        if rows[pair] != 1 or created[pair] != 1:
            return (
                len(admitted),
                f"{a['key']} to {a['destination']} (admitted at {when(a['at'])}): "
                f"{rows[pair]} message rows, {created[pair]} admissions that created one",
            )
    extra = sorted(set(rows) - admitted)
    if extra:
        d, key = extra[0]
        return len(admitted), f"{key} to {d}: a message nothing admitted"
    return len(admitted), ""


@invariant(
    "key-on-every-attempt",
    "every attempt of a message carries its key (webhook-id, Idempotency-Key)",
)
def key_on_every_attempt(v: RunView) -> tuple[int, str]:
    count = 0
    for name, arrivals in v.obs.arrivals.items():
        for a in arrivals:
            count += 1
            if not (a.webhook_id == a.idempotency_key == a.event):
                return (
                    count,
                    f"{a.event} at {name}, its request {a.seen} at {when(a.at)}: webhook-id "
                    f"{a.webhook_id!r}, Idempotency-Key {a.idempotency_key!r}",
                )
    return count, ""


@invariant("fifo-per-destination", "FIFO among a destination's eligible messages (first attempts)")
def fifo_per_destination(v: RunView) -> tuple[int, str]:
    """First attempts follow admission order among a destination's messages that nothing
    held back: a message admitted earlier, and not waiting for an older one of its
    ordering key, is never first tried after a later one."""
    count = 0
    for name, messages in v.by_dest.items():
        seen_keys: set[str] = set()
        latest: tuple[float, dict[str, Any] | None] = (-INF, None)
        for m in messages:  # in admission (id) order
            count += 1
            first = v.first_attempt[m["id"]]
            if latest[0] > first and latest[1] is not None:
                earlier = latest[1]
                return (
                    count,
                    f"{name}: {m['key']} (admitted {when(m['created'])}) was first tried at "
                    f"{when(first)}, before the older {earlier['key']} (admitted "
                    f"{when(earlier['created'])}, first tried {when(latest[0])})",
                )
            held_back = bool(m["ordering_key"]) and m["ordering_key"] in seen_keys
            if m["ordering_key"]:
                seen_keys.add(m["ordering_key"])
            if not held_back and v.first_attempt[m["id"]] > latest[0]:
                latest = (v.first_attempt[m["id"]], m)
    return count, ""


@invariant("order-within-key", "strict order within an ordering key")
def order_within_key(v: RunView) -> tuple[int, str]:
    count = 0
    for name, messages in v.by_dest.items():
        previous: dict[str, dict[str, Any]] = {}
        for m in messages:
            key = m["ordering_key"]
            if not key:
                continue
            before = previous.get(key)
            previous[key] = m
            if before is None:
                continue
            count += 1
            first = v.first_attempt[m["id"]]
            done = before["delivered"]
            broken = first != INF and (done is None or first < done)
            if not broken and done is not None and first == done:
                seq = v.delivered_seq(before)
                nexts = [a.seq for a in v.arrivals_of[(name, m["key"])]]
                broken = seq is None or (bool(nexts) and min(nexts) < seq)
            if broken:
                return (
                    count,
                    f"{name}: {m['key']} was tried at {when(first)} while the earlier "
                    f"{before['key']} of {key} was delivered {when(done)}",
                )
    return count, ""


@invariant(
    "limiter-within-rate",
    "the limiter never exceeds its rate plus burst, nor its concurrency, at the merchant",
)
def limiter_within_rate(v: RunView) -> tuple[int, str]:
    """Counted at the merchant: in any span of T seconds, at most rate × T + burst
    requests started; and never more in flight than max_in_flight."""
    count = 0
    specs = {d.name: d for d in v.obs.scenario.destinations}
    for name, arrivals in v.obs.arrivals.items():
        spec = specs[name]
        rate = spec.rate_count / spec.rate_seconds
        capacity = max(1, spec.burst)
        times = sorted(a.at for a in arrivals)
        looked, breach = over_rate(times, rate, capacity)
        count += looked
        if breach is not None:
            first, last = breach
            span = times[last] - times[first]
            return (
                count,
                f"{name}: {last - first + 1} requests from {when(times[first])} to "
                f"{when(times[last])} ({span:g} s), above {spec.rate_count}/"
                f"{spec.rate_seconds:g}s plus a burst of {capacity} ({rate * span + capacity:g})",
            )
        peak = v.obs.max_concurrency.get(name, 0)
        if peak > spec.max_in_flight:
            return (
                count,
                f"{name}: {peak} requests in flight at once, above max_in_flight "
                f"{spec.max_in_flight}",
            )
    return count, ""


@invariant("no-early-attempt", "no attempt before its next_attempt_at or Retry-After")
def no_early_attempt(v: RunView) -> tuple[int, str]:
    """No attempt before the time its previous answer set: the recorded next_attempt_at,
    and, at the merchant, the Retry-After it asked for (up to the destination's cap)."""
    count = 0
    for m in v.obs.messages:
        attempts = v.obs.attempts.get(m["id"], [])
        for before, after in zip(attempts, attempts[1:], strict=False):
            count += 1
            if before["next"] is not None and after["started"] < before["next"] - 1e-6:
                return (
                    count,
                    f"{m['key']} to {m['destination']}: attempt {after['number']} at "
                    f"{when(after['started'])}, before {when(before['next'])} as attempt "
                    f"{before['number']} set",
                )
    caps = {d.name: d.retry_after_cap_seconds for d in v.obs.scenario.destinations}
    for (name, event), arrivals in sorted(v.arrivals_of.items()):
        for before, after in zip(arrivals, arrivals[1:], strict=False):
            if before.retry_after is None:
                continue
            count += 1
            due = before.at + min(before.retry_after, caps[name])
            if after.at < due - 1e-6:
                return (
                    count,
                    f"{event} at {name}: asked to wait {before.retry_after:g} s at "
                    f"{when(before.at)} (Retry-After), tried again at {when(after.at)}",
                )
    return count, ""


@invariant("one-effect-per-key", "one effect per key, at the merchant and at this app's receiver")
def one_effect_per_key(v: RunView) -> tuple[int, str]:
    count = 0
    for m in v.obs.messages:
        count += 1
        effects = v.obs.merchant_effects.get(m["destination"], Counter())[m["key"]]
        if effects > 1 or (m["status"] == "delivered" and effects != 1):
            return count, f"{m['key']} at {m['destination']}: {effects} effects ({m['status']})"
    for key, effects in sorted(v.obs.inbound_effects.items()):
        count += 1
        if effects > 1:
            return count, f"{key} at this app's receiver: applied {effects} times"
    return count, ""


@invariant(
    "at-least-once-only",
    "a key is sent again only while none of its 2xx answers has reached the relay",
)
def at_least_once_only(v: RunView) -> tuple[int, str]:
    """At-least-once, and no more, counted at the merchant: once a request of a key was
    answered 2xx to the relay that sent it, no later request of that key arrives. A key
    goes again only after answers that failed, paced, or never reached the relay (a
    timeout, a lost response, a relay that died after sending: a crash's requests); so
    it is answered 2xx more than once only when the earlier 2xx were never heard. A
    recovery job sends failed messages again, never one whose 2xx was heard: it is held
    to the same."""
    crashed: dict[tuple[str, str], list[float]] = {}
    for c in v.obs.crashes:
        for key in c["keys"] if c["after"] == "send" else ():
            crashed.setdefault((c["destination"], key), []).append(c["at"])
    count = 0
    for (name, event), arrivals in sorted(v.arrivals_of.items()):
        heard = None
        for a in arrivals:  # in the order they arrived
            count += 1
            if heard is not None:
                return (
                    count,
                    f"{event} at {name}: sent again at {when(a.at)} (request {a.seen}), after "
                    f"its 2xx of {when(heard.answered)} reached the relay (request {heard.seen})",
                )
            crash_sent = any(t - 1e-6 <= a.at <= t + 1e-3 for t in crashed.get((name, event), []))
            if a.outcome in SUCCESSES and not crash_sent:
                heard = a
    return count, ""


@invariant(
    "ledger-balances",
    "the ledger balances (admitted = delivered + terminal + pending at the cut-off)",
    voids=True,
)
def ledger_balances(v: RunView) -> tuple[int, str]:
    """Outbound: admitted = delivered + terminal with a reason + pending at the cut-off.
    Inbound: sent = applied + dead-lettered + awaiting a retry. Nothing else."""
    admitted = {(a["destination"], a["key"]) for a in v.obs.admissions}
    states: Counter[str] = Counter()
    for m in v.obs.messages:
        if m["status"] == "failed" and not (m["last_error"] or m["last_status_code"]):
            states["terminal without a reason"] += 1
        else:
            states[m["status"]] += 1
    accounted = states["delivered"] + states["failed"] + states["pending"] + states["sending"]
    if accounted != len(admitted) or len(v.obs.messages) != len(admitted):
        others = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        return len(admitted), f"{len(admitted)} admitted, {others}: the run is void"
    sent = {s["key"] for s in v.obs.inbound_sent}
    applied = {k for k, n in v.obs.inbound_effects.items() if n}
    held = {k for k, status in v.obs.inbound_failed.items() if status in ("dead", "retrying")}
    missing = sorted(sent - applied - held)
    if missing:
        return (
            len(admitted) + len(sent),
            f"{missing[0]}: sent to this app, neither applied nor held as a failed event "
            f"({len(missing)} such): the run is void",
        )
    return len(admitted) + len(sent), ""


@invariant("silence-alert-once", "a silent sender opens one alert per silence, and it resolves")
def silence_alert_once(v: RunView) -> tuple[int, str]:
    """Every gap in the sender's traffic longer than the silence window (plus one check
    interval) opens exactly one alert, none opens otherwise, and each resolves once
    traffic returns. A silence that lasts to the cut-off is a silence too: its alert
    opens and is still open at the end."""
    spec = v.obs.scenario.inbound
    if spec is None:
        return 0, ""
    times = sorted({s["at"] for s in v.obs.inbound_sent})
    gaps = list(zip(times, times[1:], strict=False))
    slack = v.obs.scenario.beat.silence_check
    sure = [g for g in gaps if g[1] - g[0] > spec.silence_after + slack]
    maybe = [g for g in gaps if g[1] - g[0] > spec.silence_after]
    # the silence after the last request, to the cut-off: an alert that opens in it
    # stays open
    trailing = (times[-1], v.obs.cut_off) if times else None
    trailing_sure = trailing is not None and trailing[1] - trailing[0] > spec.silence_after + slack
    trailing_maybe = trailing is not None and trailing[1] - trailing[0] > spec.silence_after
    notes = v.obs.silence
    opened = [n for n in notes if n["note"] == "opened"]
    resolved = [n for n in notes if n["note"] == "resolved"]
    still_open = bool(notes) and notes[-1]["note"] == "opened"
    least, most = len(sure) + trailing_sure, len(maybe) + trailing_maybe
    problem = ""
    if not least <= len(opened) <= most:
        problem = f"{len(opened)} alerts opened for {least} silences"
        if least > len(opened):
            first = sure[0] if sure else trailing
            if first is not None:
                end = "the cut-off" if first is trailing else when(first[1])
                problem += f" (the first from {when(first[0])} to {end})"
    elif [n["note"] for n in notes] != (["opened", "resolved"] * len(opened))[: len(notes)]:
        problem = "notices out of turn: " + ", ".join(
            f"{n['note']} {when(n['at'])}" for n in notes[:6]
        )
    elif still_open and not trailing_maybe:
        problem = (
            f"the alert opened {when(opened[-1]['at'])} never resolved, though traffic returned"
        )
    elif len(resolved) != len(opened) - still_open:
        problem = f"{len(opened)} alerts opened, {len(resolved)} resolved"
    checked = len(gaps) + (trailing is not None)
    return checked, problem


@invariant(
    "never-judged-not-sending",
    "a working relay is never judged not sending (a backlog at its limit is behind)",
)
def never_judged_not_sending(v: RunView) -> tuple[int, str]:
    """The simulated workers and beat run throughout: at no sample does the status say
    relay_not_sending. A backlog at a destination's limit (a flash sale) is "behind"."""
    count = 0
    for name, judged in sorted(v.obs.judged.items()):
        for at, code in judged:
            count += 1
            if code == "relay_not_sending":
                return count, f"{name} at {when(at)}: the status said relay_not_sending"
    return count, ""


CHECKS: list[Callable[[RunView], InvariantResult]] = [
    ledger_balances,
    one_message_per_event,
    key_on_every_attempt,
    fifo_per_destination,
    order_within_key,
    limiter_within_rate,
    no_early_attempt,
    one_effect_per_key,
    at_least_once_only,
    silence_alert_once,
    terminal_answer_final,
    breaker_limits_attempts,
    retry_after_capped,
    budget_respected,
    gone_holds,
    recovery_within_rate,
    never_judged_not_sending,
]

NAMES = [
    "ledger-balances",
    "one-message-per-event",
    "key-on-every-attempt",
    "fifo-per-destination",
    "order-within-key",
    "destinations-isolated",
    "limiter-within-rate",
    "no-early-attempt",
    "one-effect-per-key",
    "at-least-once-only",
    "silence-alert-once",
    "terminal-answer-final",
    "breaker-limits-attempts",
    "retry-after-capped",
    "budget-respected",
    "gone-holds",
    "recovery-within-rate",
    "never-judged-not-sending",
]


@invariant("destinations-isolated", "a limited destination does not delay another")
def destinations_isolated(obs: Observations, alone: Observations | None) -> tuple[int, str]:
    """A limited (or failing) destination does not delay another: each destination named
    ``isolated`` gets every delivery at the same simulated time as in a run of the same
    scenario where it is the only destination."""
    if alone is None:
        return 0, ""
    then = {(m["destination"], m["key"]): m["delivered"] for m in alone.messages}
    count = 0
    for m in obs.messages:
        pair = (m["destination"], m["key"])
        if pair not in then:
            continue
        count += 1
        with_others, by_itself = m["delivered"], then[pair]
        late = (with_others is None) != (by_itself is None) or (
            with_others is not None and by_itself is not None and with_others > by_itself + 1e-6
        )
        if late:
            return (
                count,
                f"{m['key']} to {m['destination']}: delivered {when(with_others)} beside the "
                f"others, {when(by_itself)} alone",
            )
    return count, ""


def check(obs: Observations, alone: Observations | None = None) -> list[InvariantResult]:
    view = RunView(obs)
    verdicts = {verdict.name: verdict for verdict in (c(view) for c in CHECKS)}
    verdicts["destinations-isolated"] = destinations_isolated(obs, alone)
    return [verdicts[name] for name in NAMES]
