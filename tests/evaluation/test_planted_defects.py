"""A harness that cannot fail proves nothing: each test plants one defect in the app's
real code, runs a small scenario, and checks that the harness fails on it, naming the
invariant that defect breaks, while the same scenario passes without it."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest

from webhook_receiver.evaluation import scenario
from webhook_receiver.evaluation.run import evaluate
from webhook_receiver.inbound import claim as inbound_claim
from webhook_receiver.inbound import receive
from webhook_receiver.models import WebhookReceipt
from webhook_receiver.outbound import queries
from webhook_receiver.outbound.relay import claim, policy, transport

pytestmark = pytest.mark.django_db(transaction=True)


def broken(result: dict) -> list[str]:
    return [v["name"] for v in result["verdicts"] if not v["held"]]


def run(data: dict) -> dict:
    return evaluate(scenario.parse({"name": "planted", "duration": "10m", **data}), seed=3)


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


@pytest.mark.parametrize("data", [BACKLOG, ORDERED, LOSSY, PACED, INBOUND])
def test_each_scenario_passes_without_a_defect(data):
    result = run(data)

    assert broken(result) == []
    assert result["held"] and not result["void"]


def test_the_relay_order_reversed_breaks_fifo(monkeypatch):
    newest_first = queries.ELIGIBLE_IDS.replace("ORDER BY m.id", "ORDER BY m.id DESC")
    monkeypatch.setattr(queries, "ELIGIBLE_IDS", newest_first)
    monkeypatch.setattr(queries, "ELIGIBLE", {"postgresql": newest_first + " FOR UPDATE OF m"})

    result = run(BACKLOG)

    assert "fifo-per-destination" in broken(result)
    first = next(v for v in result["verdicts"] if v["name"] == "fifo-per-destination")["first"]
    assert "before the older" in first
    assert "--seed 3" in result["replay"]


def test_the_ordering_key_ignored_breaks_the_order_within_a_key(monkeypatch):
    start = queries.ELIGIBLE_IDS.index("AND (m.ordering_key = ''")
    end = queries.ELIGIBLE_IDS.index("ORDER BY m.id")
    ignored = queries.ELIGIBLE_IDS[:start] + queries.ELIGIBLE_IDS[end:]
    monkeypatch.setattr(queries, "ELIGIBLE_IDS", ignored)
    monkeypatch.setattr(queries, "ELIGIBLE", {"postgresql": ignored + " FOR UPDATE OF m"})

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

    assert broken(result) == ["no-early-attempt"]
    first = next(v for v in result["verdicts"] if v["name"] == "no-early-attempt")["first"]
    assert "Retry-After" in first


def test_a_limiter_that_overspends_breaks_the_rate(monkeypatch):
    monkeypatch.setattr(claim, "_refilled", lambda dest, now: 1000.0)

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

    result = run(INBOUND)

    assert broken(result) == ["one-effect-per-key"]
    first = next(v for v in result["verdicts"] if v["name"] == "one-effect-per-key")["first"]
    assert "at this app's receiver: applied 2 times" in first


def test_a_lost_message_voids_the_run(monkeypatch):
    """The ledger: a message that disappears (deleted behind the relay's back) makes the
    run void, whatever the other invariants say."""
    from webhook_receiver.models import OutboxMessage
    from webhook_receiver.outbound.relay import record

    recorded = record.relay_record

    def and_lose_one(dest, results, **kwargs):
        recorded(dest, results, **kwargs)
        OutboxMessage.objects.filter(key="order:ord_00003:paid:v1").delete()

    monkeypatch.setattr(record, "relay_record", and_lose_one)
    from webhook_receiver.outbound.relay import run as relay_run

    monkeypatch.setattr(relay_run, "relay_record", and_lose_one)

    result = run(BACKLOG)

    assert result["void"] and "ledger-balances" in broken(result)
