"""The status selectors (watch/sources.py, watch/traffic.py, watch/verdict.py): each
source's state and its reasons, the verdict, observed gaps and the activity series.

Records are written as the receive path, the failure capture, the silence check and
reconciliation leave them, at known times (tests/support/status.py), so that each state
and each reason can be named exactly. ``manage.py webhook_status``:
tests/watch/test_status_command.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from tests.support.status import accepted, audit, failed, receipt, refused, repair, run, silence
from webhook_receiver.core.states import State
from webhook_receiver.models import (
    RunOutcome,
)
from webhook_receiver.watch.conditions import SOURCE_CONDITIONS
from webhook_receiver.watch.sources import source_statuses
from webhook_receiver.watch.traffic import UNCONFIGURED, activity_series, observed_gaps
from webhook_receiver.watch.verdict import status_verdict

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 12, 0, 30, tzinfo=UTC)  # a Monday, 30 s into a 5-minute bucket
SOURCES = ["shop", "stripe", "github", "small", "keyed"]  # tests/settings.py, in order


def by_source(now: datetime = NOW) -> dict:
    return {s.source: s for s in source_statuses(now=now)}


def codes(status) -> list[str]:
    return [r.code for r in status.reasons]


# --- source_statuses: ok -------------------------------------------------------------------


def test_no_records_every_configured_source_is_ok_in_settings_order():
    # when
    statuses = source_statuses(now=NOW)

    # then
    assert [s.source for s in statuses] == SOURCES
    assert all(s.state == State.OK and s.reasons == () for s in statuses)
    shop = statuses[0]
    assert shop.configured
    assert shop.last_accepted_at is None and shop.last_accepted_age is None
    assert shop.requests_last_hour == 0
    assert shop.silence_after == timedelta(seconds=1200)
    assert status_verdict(statuses).text == "All 5 sources OK"
    assert status_verdict(statuses).state == State.OK


def test_traffic_in_the_last_hour_is_counted_by_result():
    # given: accepted requests of several results, inside and outside the hour
    accepted("shop", NOW - timedelta(minutes=59))
    accepted("shop", NOW - timedelta(minutes=3))
    last = accepted("shop", NOW - timedelta(seconds=30))
    audit("shop", NOW - timedelta(minutes=2), result="duplicate")
    audit("shop", NOW - timedelta(minutes=1), result="deferred", status=202)
    accepted("shop", NOW - timedelta(minutes=61))  # before the hour
    accepted("stripe", NOW - timedelta(minutes=5))

    # when
    shop = by_source()["shop"]

    # then
    assert shop.accepted_last_hour == {"applied": 3, "duplicate": 1, "deferred": 1}
    assert shop.rejected_last_hour == {}
    assert shop.requests_last_hour == 5
    assert shop.last_accepted_at == last.received_at
    assert shop.last_accepted_age == timedelta(seconds=30)
    assert shop.state == State.OK


def test_a_retry_younger_than_an_hour_and_not_overdue_is_ok():
    # given: failing for 50 min, next attempt in 5 min
    failed("shop", "retrying", first=NOW - timedelta(minutes=50), due=NOW + timedelta(minutes=5))

    # when
    shop = by_source()["shop"]

    # then
    assert (shop.retrying, shop.dead) == (1, 0)
    assert shop.oldest_retry_age == timedelta(minutes=50)
    assert shop.retry_overdue is None
    assert shop.state == State.OK


def test_resolved_and_discarded_events_and_a_resolved_alert_are_not_counted():
    failed("shop", "resolved", first=NOW - timedelta(days=1))
    failed("shop", "discarded", first=NOW - timedelta(days=1))
    silence("shop", opened=NOW - timedelta(hours=3), last=None, resolved_at=NOW)

    shop = by_source()["shop"]

    assert (shop.retrying, shop.dead, shop.silence_alert) == (0, 0, None)
    assert shop.state == State.OK


# --- source_statuses: attention ---------------------------------------------------------------


def test_dead_letters_need_attention():
    failed("shop", "dead", first=NOW - timedelta(days=2))
    failed("shop", "dead", first=NOW - timedelta(minutes=5))

    shop = by_source()["shop"]

    assert shop.dead == 2
    assert shop.state == State.ATTENTION
    assert [(r.code, r.state, r.text) for r in shop.reasons] == [
        ("dead_letters", State.ATTENTION, "2 dead letters")
    ]


def test_a_retry_failing_for_over_an_hour_needs_attention():
    # given: two retrying events; the older has failed for 1 h 30 min
    failed("shop", "retrying", first=NOW - timedelta(minutes=90), due=NOW + timedelta(minutes=9))
    failed("shop", "retrying", first=NOW - timedelta(minutes=5), due=NOW + timedelta(minutes=1))

    shop = by_source()["shop"]

    assert shop.retrying == 2
    assert shop.oldest_retry_age == timedelta(minutes=90)
    assert [(r.code, r.text) for r in shop.reasons] == [
        ("old_retry", "an event has been retrying for 1 h 30 min")
    ]
    assert shop.state == State.ATTENTION


def test_a_retry_overdue_for_longer_than_the_sweep_leaves_one_says_retries_are_not_running():
    # the shipped beat schedule sweeps every 15 s: a retry is taken within 15 s, a batch
    # (0.5 s at most) and 15 s of slack; 40 s late, the sweep is not running
    failed("shop", "retrying", first=NOW - timedelta(minutes=40), due=NOW - timedelta(seconds=40))

    shop = by_source()["shop"]

    assert shop.retry_overdue == timedelta(seconds=40)
    assert shop.retry_pickup == timedelta(seconds=30.5)
    assert [(r.code, r.state, r.text) for r in shop.reasons] == [
        (
            "retries_stalled",
            State.ALERT,
            "retries are not running: one was due 40 s ago (a running sweep retries it "
            "within 30 s)",
        )
    ]


def test_a_retry_overdue_within_the_sweeps_pickup_is_no_state():
    failed("shop", "retrying", first=NOW - timedelta(minutes=40), due=NOW - timedelta(seconds=20))

    assert by_source()["shop"].reasons == ()


@override_settings(WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, "SWEEP_BATCH_SIZE": 2})
def test_many_retries_due_at_once_give_the_sweep_a_batch_of_time_for_each():
    # given: 40 retries due 35 s ago, and batches of 2: 20 batches of up to 0.5 s each
    for n in range(40):
        late = NOW - timedelta(seconds=35)
        failed("shop", "retrying", first=NOW - timedelta(minutes=5), due=late, key=f"due-{n}")

    shop = by_source()["shop"]

    # then: 15 s + 20 × 0.5 s + 15 s = 40 s, and 35 s late is not yet a state
    assert shop.retry_pickup == timedelta(seconds=40)
    assert shop.reasons == ()


def test_refused_requests_in_the_last_hour_need_attention():
    # given
    refused("stripe", NOW - timedelta(minutes=10))
    refused("stripe", NOW - timedelta(minutes=20))
    refused("stripe", NOW - timedelta(minutes=30), "timestamp_out_of_tolerance")
    refused("stripe", NOW - timedelta(minutes=70))  # before the hour
    refused("stripe", NOW + timedelta(minutes=1))  # after now

    # when
    stripe = by_source()["stripe"]

    # then
    assert stripe.rejected_last_hour == {"invalid_signature": 2, "timestamp_out_of_tolerance": 1}
    assert stripe.state == State.ATTENTION
    assert [r.text for r in stripe.reasons] == [
        "3 requests refused in the last hour (invalid_signature: 2, timestamp_out_of_tolerance: 1)"
    ]


def test_a_503_is_not_stored_and_needs_attention():
    audit("shop", NOW - timedelta(minutes=4), result="OperationalError", status=503)

    shop = by_source()["shop"]

    assert shop.accepted_last_hour == {}
    assert shop.rejected_last_hour == {"temporarily_unavailable": 1}
    assert [(r.code, r.text) for r in shop.reasons] == [
        ("not_stored", "1 request answered 503 (not stored) in the last hour")
    ]


def test_a_failed_reconciliation_run_needs_attention(settings):
    # given: github reconciled; its last finished run failed (a later one is running)
    reconcile(settings, "github")
    run("github", RunOutcome.OK, started=NOW - timedelta(hours=2))
    run("github", RunOutcome.FAILED, started=NOW - timedelta(hours=1), error="sender said 500")
    run("github", RunOutcome.RUNNING, started=NOW - timedelta(minutes=1))

    github = by_source()["github"]

    assert github.last_run.outcome == RunOutcome.FAILED
    assert [(r.code, r.text) for r in github.reasons] == [
        ("reconcile_failed", "the last reconciliation failed: sender said 500")
    ]
    assert github.state == State.ATTENTION


# --- source_statuses: alert -------------------------------------------------------------------


def test_an_open_silence_alert_is_an_alert():
    # given: silent since 42 min ago; 12 requests refused in the silence
    silence(
        "shop",
        opened=NOW - timedelta(minutes=22),
        last=NOW - timedelta(minutes=42),
        rejected_counts={"invalid_signature": 12},
        rejected_total=12,
    )

    shop = by_source()["shop"]

    assert shop.silence_alert is not None
    assert shop.state == State.ALERT
    assert [(r.code, r.state, r.text) for r in shop.reasons] == [
        (
            "silent",
            State.ALERT,
            "silent: no accepted event for 42 min (window 20 min), 12 refused meanwhile "
            "(invalid_signature: 12)",
        )
    ]


def test_open_repair_items_are_an_alert_and_the_last_run_is_shown(settings):
    # given: the last run found two missing events and one failed
    reconcile(settings, "shop")
    found = run("shop", RunOutcome.NEEDS_REPAIR, started=NOW - timedelta(minutes=30))
    for kind, key in (("missing", "evt_1"), ("missing", "evt_2"), ("failed", "evt_3")):
        repair("shop", kind, key, found)
    failed("shop", "dead", first=NOW - timedelta(hours=3))

    # when
    shop = by_source()["shop"]

    # then: both reasons, the alert first
    assert shop.last_run == found
    assert shop.open_repairs == {"missing": 2, "failed": 1}
    assert shop.state == State.ALERT
    assert [(r.code, r.state, r.text) for r in shop.reasons] == [
        ("repair_needed", State.ALERT, "3 open repair items (missing: 2, failed: 1)"),
        ("dead_letters", State.ATTENTION, "1 dead letter"),
    ]


def test_a_source_no_longer_configured_is_listed_while_it_holds_dead_letters():
    # given: a source removed from the settings, with a dead letter; another unknown slug
    # that only received refused requests
    failed("legacy", "dead", first=NOW - timedelta(days=3))
    refused("wp-admin", NOW - timedelta(minutes=3), "unknown_source")

    statuses = source_statuses(now=NOW)

    assert [s.source for s in statuses] == [*SOURCES, "legacy"]
    legacy = statuses[-1]
    assert not legacy.configured
    assert legacy.silence_after is None
    assert codes(legacy) == ["dead_letters"]


def test_the_rule_has_one_line_of_why_per_condition():
    assert [c.code for c in SOURCE_CONDITIONS] == [
        "secrets_unreadable",
        "silent",
        "repair_needed",
        "retries_stalled",
        "dead_letters",
        "old_retry",
        "not_stored",
        "rejected",
        "reconcile_failed",
    ]
    assert all(c.why and c.state in (State.ALERT, State.ATTENTION) for c in SOURCE_CONDITIONS)
    # alerts come first, so a source's first reason is its worst
    levels = [c.state for c in SOURCE_CONDITIONS]
    assert levels == sorted(levels, reverse=True)


# --- the verdict ---------------------------------------------------------------------------


def test_verdict_names_each_source_that_is_not_ok_with_its_first_reason():
    # given: shop has 4 dead letters; stripe is silent and has refusals
    for minutes in range(4):
        failed("shop", "dead", first=NOW - timedelta(minutes=minutes + 1))
    silence("stripe", opened=NOW - timedelta(minutes=5), last=NOW - timedelta(minutes=25))
    refused("stripe", NOW - timedelta(minutes=3))

    verdict = status_verdict(source_statuses(now=NOW))

    assert verdict.state == State.ALERT
    assert verdict.text == (
        "1 source in alert: stripe — silent for 25 min (+1 more). "
        "1 source needs attention: shop — 4 dead letters"
    )


def test_verdict_for_one_source_needing_attention():
    failed("shop", "dead", first=NOW - timedelta(minutes=1))

    verdict = status_verdict(source_statuses(now=NOW))

    assert (verdict.state, verdict.text) == (
        State.ATTENTION,
        "1 source needs attention: shop — 1 dead letter",
    )


# --- observed gaps -------------------------------------------------------------------------


def test_observed_gaps_from_known_timestamps():
    # given: 101 receipts: 99 gaps of 1 min, one of 30 min (and another source's)
    start = NOW - timedelta(days=2)
    moments = [start + timedelta(minutes=i) for i in range(50)]
    moments += [moments[-1] + timedelta(minutes=30 + i) for i in range(51)]
    for i, at in enumerate(moments):
        receipt("shop", at, key=f"k{i}")
    receipt("stripe", NOW - timedelta(minutes=1))
    receipt("shop", NOW - timedelta(days=8), key="too-old")

    # when
    gaps = observed_gaps(source="shop", now=NOW)

    # then: nearest rank: p50 and p99 are 1 min, the max 30 min
    assert gaps.count == 100
    assert (gaps.p50, gaps.p99, gaps.max) == (
        timedelta(minutes=1),
        timedelta(minutes=1),
        timedelta(minutes=30),
    )
    assert (gaps.since, gaps.until) == (moments[0], moments[-1])
    assert not gaps.truncated
    assert gaps.longer_than_window == 1  # the window is 20 min


def test_observed_gaps_percentiles_with_spread():
    # given: gaps of 1, 2, …, 200 s (shuffled order of arrival does not matter)
    at = NOW - timedelta(days=1)
    for i, gap in enumerate([0, *range(1, 201)]):
        at += timedelta(seconds=gap)
        receipt("github", at, key=f"g{i}")

    gaps = observed_gaps(source="github", now=NOW)

    assert gaps.count == 200
    assert gaps.p50 == timedelta(seconds=100)
    assert gaps.p99 == timedelta(seconds=198)
    assert gaps.max == timedelta(seconds=200)
    assert gaps.longer_than_window == 0


def test_observed_gaps_reads_at_most_limit_newest_events():
    for i in range(10):
        receipt("shop", NOW - timedelta(hours=10 - i), key=f"k{i}")

    gaps = observed_gaps(source="shop", now=NOW, limit=4)

    assert gaps.truncated
    assert gaps.count == 3
    assert gaps.since == NOW - timedelta(hours=4)
    assert gaps.until == NOW - timedelta(hours=1)


def test_observed_gaps_need_two_events():
    assert observed_gaps(source="shop", now=NOW) is None
    receipt("shop", NOW - timedelta(hours=1))
    assert observed_gaps(source="shop", now=NOW) is None


# --- activity series ------------------------------------------------------------------------


def test_activity_series_buckets():
    # given: NOW is 12:00:30, so the last bucket is 12:00-12:05 and the first 12:05 yesterday
    audit("shop", NOW - timedelta(seconds=10))  # 12:00:20, last bucket
    audit("shop", NOW - timedelta(seconds=40))  # 11:59:50, the bucket before
    refused("shop", NOW - timedelta(seconds=50))  # 11:59:40
    audit("shop", NOW - timedelta(minutes=2), result="OperationalError", status=503)  # 11:58:30
    audit("shop", datetime(2026, 3, 1, 12, 5, tzinfo=UTC))  # the first bucket's first moment
    audit("shop", datetime(2026, 3, 1, 12, 4, 59, tzinfo=UTC))  # before the 24 hours
    refused("nobody", NOW - timedelta(hours=3), "unknown_source")
    refused("nobody-else", NOW - timedelta(hours=3), "unknown_source")

    # when
    series = activity_series(now=NOW)

    # then: every configured source, 288 buckets, plus the unconfigured slugs summed
    assert list(series) == [*SOURCES, UNCONFIGURED]
    shop = series["shop"]
    assert len(shop) == 288
    assert shop[0].start == datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    assert shop[-1].start == datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    assert (shop[-1].accepted, shop[-1].rejected) == (1, 0)
    assert (shop[-2].accepted, shop[-2].rejected) == (1, 2)  # refused and 503
    assert (shop[0].accepted, shop[0].rejected) == (1, 0)
    assert sum(b.accepted + b.rejected for b in shop) == 5
    assert sum(b.accepted + b.rejected for b in series["stripe"]) == 0
    other = series[UNCONFIGURED]
    assert [(b.start, b.rejected) for b in other if b.rejected] == [
        (datetime(2026, 3, 2, 9, 0, tzinfo=UTC), 2)
    ]


def test_activity_series_other_bucket_sizes():
    audit("stripe", NOW - timedelta(minutes=50))  # 11:10:30

    series = activity_series(now=NOW, hours=2, bucket_minutes=15)["stripe"]

    assert len(series) == 8
    assert series[-1].start == datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    assert [b.start for b in series if b.accepted] == [datetime(2026, 3, 2, 11, 0, tzinfo=UTC)]
    with pytest.raises(ValueError):
        activity_series(now=NOW, bucket_minutes=7)


# --- every read is an index range -------------------------------------------------------------


@pytest.mark.postgres_only("the plans checked are those of PostgreSQL's planner")
def test_every_status_query_can_use_an_index(settings):
    # given: a reconciled source, so that the last-run lookup runs too
    reconcile(settings, "shop")
    with CaptureQueriesContext(connection) as captured:
        source_statuses(now=NOW)
        observed_gaps(source="shop", now=NOW)
        activity_series(now=NOW)
    statements = [q["sql"] for q in captured.captured_queries]
    # … and the rejection tallies' ranges, for the last hour and for the activity; and
    # the source records, once (the snapshot serves the rest)
    assert len(statements) == 4 + 2 * len(SOURCES) + 1 + 2 + 2 + 1

    # when: sequential scans are priced out, the planner must find an index for each
    plans = []
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in statements:
            cursor.execute(f"EXPLAIN {sql}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))

    # then: no scan of a whole table
    for sql, plan in zip(statements, plans, strict=True):
        assert "Seq Scan" not in plan, (sql, plan)
        assert "Index" in plan, (sql, plan)


# --- helpers -------------------------------------------------------------------------------


def reconcile(settings, *slugs: str) -> None:
    """Turn reconciliation on for ``slugs`` (the runs here are written directly)."""
    config = settings.WEBHOOK_RECEIVER
    sources = {
        slug: {**options, "RECONCILE": {"ADAPTER": "file", "OPTIONS": {"PATH": "/nonexistent"}}}
        if slug in slugs
        else options
        for slug, options in config["SOURCES"].items()
    }
    settings.WEBHOOK_RECEIVER = {**config, "SOURCES": sources}
