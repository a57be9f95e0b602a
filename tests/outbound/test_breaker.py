"""The circuit breaker's one decision (breaker.breaker_after), on rows that are never
saved: when it opens, how long it stays open, the one probe of half-open, what a
success and a failure do then, and the answers it does not count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from webhook_receiver.models import WebhookDestination
from webhook_receiver.outbound.breaker import breaker_after, destination_breaker
from webhook_receiver.outbound.relay.limits import after_answers, allowance
from webhook_receiver.outbound.relay.messages import Claimed, Sent
from webhook_receiver.outbound.relay.policy import decide

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
COOL_DOWN = timedelta(seconds=60)


def row(**fields) -> WebhookDestination:
    """A destination with a threshold of 3 and a minute's cool-down, as a round locks it."""
    return WebhookDestination(
        name="merchant",
        breaker_threshold=3,
        breaker_cooldown_seconds=COOL_DOWN.total_seconds(),
        max_in_flight=4,
        **fields,
    )


def counted(dest: WebhookDestination, now: datetime = NOW, **answers: int):
    return breaker_after(dest, dest.consecutive_failures, dest.paused_until, now, **answers)


def test_failures_below_the_threshold_leave_it_closed_and_the_threshold_opens_it():
    dest = row(consecutive_failures=1)

    below = counted(dest, failures=1)
    at = counted(dest, failures=2)

    assert (below.state, below.consecutive_failures, below.opened) == ("closed", 2, False)
    assert below.paused_until is None and below.in_flight_limit == dest.max_in_flight
    assert (at.state, at.consecutive_failures, at.opened) == ("open", 3, True)
    assert at.until == at.paused_until == NOW + COOL_DOWN
    assert at.in_flight_limit == 0


def test_it_stays_open_until_the_cool_down_ends_then_is_half_open():
    dest = row(consecutive_failures=3, paused_until=NOW + COOL_DOWN)

    assert destination_breaker(dest, now=NOW + COOL_DOWN - timedelta(seconds=1)).state == "open"
    half_open = destination_breaker(dest, now=NOW + COOL_DOWN)
    assert (half_open.state, half_open.until, half_open.opened) == ("half-open", None, False)
    # no answers leave the row as it is (an ended pause too)
    assert half_open.paused_until == dest.paused_until
    assert half_open.consecutive_failures == 3


def test_half_open_lets_one_probe_through_only_when_none_is_in_flight():
    # the breaker allows one request in flight; the round's statement subtracts the
    # requests it counts in flight under the row's lock: 1 - 0 one probe, 1 - 1 none
    dest = row(consecutive_failures=3, paused_until=NOW - timedelta(seconds=1))

    assert destination_breaker(dest, now=NOW).in_flight_limit == 1
    claim = allowance(dest, after_answers(dest, [], NOW), NOW, limit=10)
    assert claim.open and claim.in_flight_limit == 1 and claim.paused_until is None


def test_a_success_closes_it_whatever_failed_beside_it():
    dest = row(consecutive_failures=3, paused_until=NOW - timedelta(seconds=1))

    closed = counted(dest, successes=1, failures=2)

    assert (closed.state, closed.consecutive_failures, closed.paused_until) == ("closed", 0, None)
    assert closed.in_flight_limit == dest.max_in_flight and not closed.opened


def test_a_failed_probe_opens_it_again_for_a_new_cool_down():
    dest = row(consecutive_failures=3, paused_until=NOW - COOL_DOWN)
    later = NOW + timedelta(seconds=5)

    again = counted(dest, later, failures=1)

    assert (again.state, again.consecutive_failures, again.opened) == ("open", 4, True)
    assert again.until == later + COOL_DOWN


def test_an_open_breaker_claims_nothing_and_says_until_when():
    dest = row(consecutive_failures=2)

    after = after_answers(dest, [decide(dest, answered(500), NOW)], NOW)
    claim = allowance(dest, after, NOW, limit=10)

    assert after.opened and after.paused_until == NOW + COOL_DOWN
    assert not claim.open and claim.allowed == 0 and claim.paused_until == NOW + COOL_DOWN


def test_a_410_gone_is_not_counted():
    dest = row(consecutive_failures=2, paused_until=NOW - timedelta(seconds=1))

    verdict = decide(dest, answered(410), NOW)
    after = after_answers(dest, [verdict], NOW)

    assert verdict.gone and not verdict.breaker_failure
    assert after.counted  # counted by retirement, which disables the destination
    assert (after.consecutive_failures, after.paused_until, after.opened) == (
        2,
        dest.paused_until,
        False,
    )


def answered(status_code: int) -> Sent:
    message = Claimed(1, "order:o1:paid:v1", "order.paid", {}, 1, 0, NOW)
    return Sent(message, NOW, 10, status_code=status_code)
