"""A harness that cannot fail proves nothing: each test plants one defect in the app's
real code, runs a small scenario, and checks that the harness fails on it, naming the
invariant that defect breaks, while the same scenario passes without it."""

from __future__ import annotations

import copy
from dataclasses import replace
from unittest import mock

import pytest

from tests.support.defects import limiter_overspends
from webhook_receiver.evaluation import scenario
from webhook_receiver.evaluation import simulation as simulation_module
from webhook_receiver.evaluation.run import evaluate
from webhook_receiver.inbound import claim as inbound_claim
from webhook_receiver.inbound import receive
from webhook_receiver.models import WebhookReceipt
from webhook_receiver.outbound import queries, recovery, recovery_run
from webhook_receiver.outbound.relay import engine, limits, policy, transport
from webhook_receiver.outbound.relay import round as relay_round

pytestmark = pytest.mark.django_db(transaction=True)


def broken(result: dict) -> list[str]:
    return [v["name"] for v in result["verdicts"] if not v["held"]]


# a sample every 10 s of the 10 minutes: enough to see the status judge a backlog, and a
# quarter of a built-in scenario's 240 readings (each the real status read, some 8 ms)
SAMPLES = 60


def run(data: dict) -> dict:
    planted = scenario.parse({"name": "planted", "duration": "10m", **data})
    return evaluate(planted, seed=3, samples=SAMPLES)


def first(result: dict, name: str) -> str:
    return next(v for v in result["verdicts"] if v["name"] == name)["first"]


def breaks_alone(data: dict, name: str) -> str:
    """Run ``data``: verdict ``name`` must be the one broken. Returns its first breach."""
    result = run(data)
    assert broken(result) == [name]
    return first(result, name)


BACKLOG = {
    "destinations": [{"name": "shop", "rate": "2/s", "burst": 2, "max_in_flight": 2}],
    "admissions": [{"orders": 20, "over": 0}],
}

ORDERED = {
    "destinations": [
        {
            "name": "shop",
            "faults": [{"status": 503, "attempts": [1], "events": ["paid"]}],
        }
    ],
    "admissions": [
        {
            "orders": 10,
            "over": "10s",
            "events": ["paid", "cancelled", "fulfilled"],
            "ordering": True,
        }
    ],
}

LOSSY = {
    "destinations": [
        {"name": "shop", "faults": [{"lose_response": True, "attempts": [1], "share": 0.5}]}
    ],
    "admissions": [{"orders": 20, "over": "10s"}],
}

PACED = {
    "destinations": [
        {
            "name": "shop",
            "backoff_base": "1s",
            "faults": [{"status": 429, "retry_after": 120, "attempts": [1]}],
        }
    ],
    "admissions": [{"orders": 5, "over": "5s"}],
}

INBOUND = {
    "inbound": {"events": 40, "over": "4m", "silence_after": "1h", "fail_after_effect": 0.3},
}

# a merchant that rejects some events for good (a permanent answer, on the first attempt)
REJECTING = {
    "destinations": [
        {
            "name": "shop",
            "faults": [
                {"status": 400, "attempts": [1], "share": 0.2, "group": "malformed"},
                {"status": 404, "attempts": [1], "share": 0.1, "group": "gone"},
                {"status": 422, "attempts": [1], "share": 0.1, "group": "invalid"},
            ],
        }
    ],
    "admissions": [{"orders": 20, "over": "10s"}],
}

# a merchant that answers 500 for four and a half minutes under steady traffic
OUTAGE = {
    "destinations": [
        {
            "name": "shop",
            "breaker_threshold": 3,
            "breaker_cooldown": "30s",
            "faults": [{"status": 500, "from": "30s", "until": "5m"}],
        }
    ],
    "admissions": [{"orders": 100, "over": "8m"}],
}

# a Retry-After of an hour, above a cap of a minute
GREEDY = {
    "destinations": [
        {
            "name": "shop",
            "retry_after_cap": "1m",
            "faults": [{"status": 429, "retry_after": 3600, "attempts": [1], "share": 0.3}],
        }
    ],
    "admissions": [{"orders": 10, "over": "10s"}],
}

# a share of the events fails every time: their budget of three is spent
SPENDING = {
    "destinations": [
        {
            "name": "shop",
            "max_attempts": 3,
            "backoff_base": "1s",
            "backoff_cap": "10s",
            "faults": [{"status": 500, "share": 0.2}],
        }
    ],
    "admissions": [{"orders": 20, "over": "10s"}],
}

# a merchant that answers 410 Gone for two minutes; an operator enables it at five
GONE = {
    "destinations": [
        {
            "name": "shop",
            "max_in_flight": 2,
            "enable_at": "5m",
            "faults": [{"status": 410, "from": "1m", "until": "3m"}],
        }
    ],
    "admissions": [{"orders": 30, "over": "4m", "events": ["paid", "fulfilled"], "ordering": True}],
}

# a merchant down for three minutes with a budget of two attempts: what was admitted then
# fails, and an operator's recovery job sends it again at 1/s once it is back
RECOVERING = {
    "destinations": [
        {
            "name": "shop",
            "rate": "5/s",
            "burst": 5,
            "max_in_flight": 2,
            "max_attempts": 2,
            "backoff_base": "1s",
            "backoff_cap": "5s",
            "breaker_threshold": 10000,
            "faults": [{"down": True, "from": "0s", "until": "3m"}],
            "recovery": {"at": "4m", "kind": "recover", "since": "0s", "rate": "1/s"},
        }
    ],
    "admissions": [{"orders": 40, "over": "6m"}],
}

# the sender goes quiet at 20 minutes in a run cut off at an hour: a silence to the end
TRAILING_SILENCE = {
    "duration": "1h",
    "inbound": {"events": 40, "over": "20m", "silence_after": "10m"},
}


@pytest.mark.parametrize(
    "data",
    [
        BACKLOG,
        ORDERED,
        LOSSY,
        PACED,
        INBOUND,
        REJECTING,
        OUTAGE,
        GREEDY,
        SPENDING,
        TRAILING_SILENCE,
        GONE,
        RECOVERING,
    ],
)
def test_each_scenario_passes_without_a_defect(data):
    result = run(data)

    assert broken(result) == []
    assert result["held"] and not result["void"]


def test_the_relay_order_reversed_breaks_fifo(monkeypatch):
    newest_first = queries.ELIGIBLE_IDS.replace("ORDER BY m.id", "ORDER BY m.id DESC")
    monkeypatch.setattr(queries, "ELIGIBLE_IDS", newest_first)

    result = run(BACKLOG)

    assert "fifo-per-destination" in broken(result)
    assert "before the older" in first(result, "fifo-per-destination")
    assert "--seed 3" in result["replay"]


def test_the_ordering_key_ignored_breaks_the_order_within_a_key(monkeypatch):
    start = queries.ELIGIBLE_IDS.index("AND (m.ordering_key = ''")
    end = queries.ELIGIBLE_IDS.index("ORDER BY m.id")
    ignored = queries.ELIGIBLE_IDS[:start] + queries.ELIGIBLE_IDS[end:]
    monkeypatch.setattr(queries, "ELIGIBLE_IDS", ignored)

    assert broken(run(ORDERED)) == ["order-within-key"]


def test_a_key_that_changes_per_attempt_breaks_the_key_on_every_attempt(monkeypatch):
    signed = transport.signed_request

    def per_attempt(dest, message, timestamp):
        return signed(dest, replace(message, key=f"{message.key}:{message.attempt}"), timestamp)

    monkeypatch.setattr(transport, "signed_request", per_attempt)

    found = broken(run(LOSSY))

    # the merchant deduplicates on the header: a changed key is a second effect too
    assert found[0] == "key-on-every-attempt" and "one-effect-per-key" in found


def test_retry_after_ignored_breaks_no_early_attempt(monkeypatch):
    monkeypatch.setattr(policy, "parse_retry_after", lambda *args, **kwargs: None)

    result = run(PACED)

    # what was asked is not waited: too early at the merchant, and set short of it
    assert broken(result) == ["no-early-attempt", "retry-after-capped"]
    assert "Retry-After" in first(result, "no-early-attempt")


def test_a_limiter_that_overspends_breaks_the_rate(monkeypatch):
    limiter_overspends(monkeypatch)

    assert broken(run(BACKLOG)) == ["limiter-within-rate"]


def test_a_receiver_that_checks_before_it_inserts_applies_twice(monkeypatch):
    """The defect: look the key up, apply the effect in a transaction of its own, then
    record the receipt; a handler that fails after its write leaves the effect, and the
    retry applies it again."""
    claim_and_apply = receive.event_claim_and_apply

    def check_then_insert(*, event, **kwargs):
        exists = WebhookReceipt.objects.filter(source=event.source, event_key=event.event_key)
        if not exists.exists():
            inbound_claim.get_handler(event.event_type)(event)
        with mock.patch.object(inbound_claim, "get_handler", return_value=lambda event: None):
            return claim_and_apply(event=event, **kwargs)

    monkeypatch.setattr(receive, "event_claim_and_apply", check_then_insert)

    assert "at this app's receiver: applied 2 times" in breaks_alone(INBOUND, "one-effect-per-key")


def test_a_lost_message_voids_the_run(monkeypatch):
    """The ledger: a message that disappears (deleted behind the relay's back) makes the
    run void, whatever the other invariants say."""
    from webhook_receiver.models import OutboxMessage

    recorded = engine.relay_round_or_apart

    def and_lose_one(work, **kwargs):
        outcomes = recorded(work, **kwargs)
        OutboxMessage.objects.filter(key="order:ord_00003:paid:v1").delete()
        return outcomes

    monkeypatch.setattr(engine, "relay_round_or_apart", and_lose_one)

    result = run(BACKLOG)

    assert result["void"] and "ledger-balances" in broken(result)


def test_a_permanent_answer_retried_breaks_the_terminal_answer(monkeypatch):
    """400, 404 and 422 treated as transient: the merchant's rejections are retried."""
    monkeypatch.setattr(policy, "TERMINAL_STATUSES", frozenset())

    assert "later request" in breaks_alone(REJECTING, "terminal-answer-final")


def test_a_terminal_answer_given_one_more_try_breaks_the_terminal_answer(monkeypatch):
    """A relay that tries a permanent answer once more before it gives up."""
    decide = policy.decide

    def one_more_try(dest, sent, now):
        if sent.status_code in policy.TERMINAL_STATUSES and sent.message.failures == 0:
            return policy.Decision("pending", now, spends_budget=True, breaker_failure=False)
        return decide(dest, sent, now)

    monkeypatch.setattr(relay_round, "decide", one_more_try)

    assert broken(run(REJECTING)) == ["terminal-answer-final"]


def test_a_breaker_that_never_opens_breaks_the_breaker(monkeypatch):
    """Nothing recorded on the breaker: the merchant is hammered through its outage."""

    def nothing_counted(dest, verdicts, now):
        after = limits.after_answers(dest, verdicts, now)
        return replace(after, consecutive_failures=0, paused_until=None, opened=False)

    monkeypatch.setattr(relay_round, "after_answers", nothing_counted)

    assert "with the breaker open since" in breaks_alone(OUTAGE, "breaker-limits-attempts")


def test_a_breaker_whose_pause_ends_at_once_breaks_the_breaker(monkeypatch):
    """The breaker opens, but for no cool-down: a probe follows each failure at once."""

    def no_cool_down(dest, verdicts, now):
        impatient = copy.copy(dest)
        impatient.breaker_cooldown_seconds = 0
        return limits.after_answers(impatient, verdicts, now)

    monkeypatch.setattr(relay_round, "after_answers", no_cool_down)

    assert "no probe due before" in breaks_alone(OUTAGE, "breaker-limits-attempts")


def test_a_retry_after_above_the_cap_waited_in_full_breaks_the_cap(monkeypatch):
    """The cap ignored: an hour's Retry-After waited for an hour."""
    read = policy.parse_retry_after
    monkeypatch.setattr(
        policy, "parse_retry_after", lambda value, *, now, cap: read(value, now=now, cap=10**9)
    )

    assert "asked to wait 3600 s (the cap 60 s)" in breaks_alone(GREEDY, "retry-after-capped")


def test_a_budget_ignored_breaks_the_budget(monkeypatch):
    """A relay that never spends the retry budget: failing messages are tried for ever."""
    decide = policy.decide

    def endless(dest, sent, now):
        generous = copy.copy(dest)
        generous.max_attempts = 10**6
        return decide(generous, sent, now)

    monkeypatch.setattr(relay_round, "decide", endless)

    assert "against a budget of 3" in breaks_alone(SPENDING, "budget-respected")


def test_a_silence_check_that_never_runs_misses_a_trailing_silence(monkeypatch):
    monkeypatch.setattr(simulation_module, "check_silence", lambda: None)

    assert "to the cut-off" in breaks_alone(TRAILING_SILENCE, "silence-alert-once")


def test_a_410_taken_as_a_permanent_answer_breaks_gone_holds(monkeypatch):
    """The relay fails a message answered 410 rather than retire its destination."""
    monkeypatch.setattr(policy, "GONE_STATUS", -1)
    monkeypatch.setattr(policy, "TERMINAL_STATUSES", policy.TERMINAL_STATUSES | {410})

    result = run(GONE)

    assert "gone-holds" in broken(result)
    assert "failed for a 410" in first(result, "gone-holds") or "arrived at" in first(
        result, "gone-holds"
    )


def test_a_410_that_disables_nothing_breaks_gone_holds(monkeypatch):
    """The 410 holds its message but the destination is never disabled: the rest go on."""

    def never_disabled(dest, verdicts, now):
        after = limits.after_answers(dest, verdicts, now)
        return replace(
            after,
            enabled=dest.enabled,
            disabled_reason=dest.disabled_reason,
            disabled_at=dest.disabled_at,
            retired=None,
        )

    monkeypatch.setattr(relay_round, "after_answers", never_disabled)

    result = run(GONE)

    assert "gone-holds" in broken(result)
    assert "before it was enabled" in first(result, "gone-holds")


def test_a_recovery_releasing_ten_times_its_pace_breaks_its_rate(monkeypatch):
    release = recovery_run._release
    monkeypatch.setattr(
        recovery_run, "_release", lambda job, room, now: release(job, room * 10, now)
    )

    result = run(RECOVERING)

    assert "recovery-within-rate" in broken(result)


def test_a_recovery_that_sends_delivered_messages_again_breaks_at_least_once(monkeypatch):
    monkeypatch.setitem(recovery.SELECTS, "recover", "delivered")

    result = run(RECOVERING)

    assert "at-least-once-only" in broken(result)
