"""GET /metrics/: what it counts equals what the audit trail and the tables say, a scrape
the database cannot answer fails whole, and it is shut to anyone without the token.
(Under two gunicorn workers: tests/watch/test_metrics_workers.py; the example alerting
rules: tests/watch/test_alert_rules.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models import Min
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from tests.support import handlers
from tests.support.failing import CRASH, fail_crash, fail_schema
from tests.support.fuzzing import THROUGH_THE_DATABASE
from tests.support.http import post
from tests.support.metrics import AUTH, TOKEN, delta, labels, scrape, series, value
from tests.support.reconciling import needs_repair_run
from tests.support.signing import event_body, reserved, standard_headers
from tests.support.status import repair
from webhook_receiver.inbound import metrics
from webhook_receiver.models import (
    FailedEvent,
    FailureStatus,
    RepairItem,
    RepairKind,
    RequestAudit,
    SilenceAlert,
    WebhookReceipt,
)
from webhook_receiver.watch.sources import source_statuses as statuses
from webhook_receiver.watch.traffic import last_accepted_at

SOURCES = ("shop", "stripe", "github", "small", "keyed")  # tests/settings.py


# --- counters against the audit trail --------------------------------------------------


@pytest.mark.django_db
def test_counters_equal_what_the_audit_records_say(client, settings, metrics_on):
    # given: a handler that fails once (deferred, retried later), and a scrape before
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {CRASH: "tests.support.handlers.fails_after_writing"},
    }
    handlers.failures_left["count"] = 0
    before = scrape(client)

    # when: one request of every kind
    body = reserved("ord_1", ("SKU-1", 1))
    paid = event_body("order.paid", order_id="ord_9", version=2)
    older = event_body("order.cancelled", order_id="ord_9", version=1)
    no_handler = event_body("customer.created", id="c1")
    answers = [
        post(client, "shop", body, standard_headers(body, msg_id="m1")),
        post(client, "shop", body, standard_headers(body, msg_id="m1")),
        post(client, "shop", paid, standard_headers(paid)),
        post(client, "shop", older, standard_headers(older)),
        post(client, "shop", no_handler, standard_headers(no_handler)),
        post(client, "shop", body, standard_headers(body, secret="whsec_" + "A" * 32)),
        post(client, "shop", body, {}),
        post(client, "nope", body, standard_headers(body)),
        post(client, "small", b"x" * 2000, {}),
    ]
    fail_crash(client, "m_deferred")
    fail_schema(client, "m_dead")
    after = scrape(client)

    # then: each got its usual answer
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 200, 401, 400, 404, 413]
    statuses = [a.json()["status"] for a in answers[:5]]
    assert statuses == ["applied", "duplicate", "applied", "stale", "ignored"]
    # then: the accepted requests, by source and result, are the verified audit records
    audits = RequestAudit.objects.all()
    accepted = Counter((a.source, a.result) for a in audits if a.verification == "verified")
    assert delta(before, after, "webhook_receiver_events_total") == {
        labels(source=s, result=r): n for (s, r), n in accepted.items()
    }
    assert set(accepted) == {
        ("shop", r)
        for r in ("applied", "duplicate", "stale", "ignored", "deferred", "dead_lettered")
    }
    # the refused ones are the rest, under "unknown" when the slug is not configured
    refused = Counter(
        (a.source if a.source in SOURCES else "unknown", a.verification)
        for a in audits
        if a.verification != "verified"
    )
    assert delta(before, after, "webhook_receiver_rejected_total") == {
        labels(source=s, reason=r): n for (s, r), n in refused.items()
    }
    assert len(refused) == 4
    # every accepted request was timed; refusals were not
    assert delta(before, after, "webhook_receiver_receive_seconds_count") == {
        labels(source="shop"): sum(accepted.values())
    }


@pytest.mark.django_db
def test_every_configured_source_has_its_series_from_the_start(client, metrics_on):
    samples = scrape(client)

    for source in SOURCES:
        for result in ("applied", "duplicate", "stale", "ignored", "deferred", "dead_lettered"):
            key = ("webhook_receiver_events_total", labels(source=source, result=result))
            assert key in samples
        for reason in ("invalid_signature", "payload_too_large", "temporarily_unavailable"):
            key = ("webhook_receiver_rejected_total", labels(source=source, reason=reason))
            assert key in samples
        assert value(samples, "webhook_receiver_silence_alert_open", source=source) == 0
        # no accepted event yet: no timestamp (not 1970)
        key = ("webhook_receiver_last_event_timestamp_seconds", labels(source=source))
        assert key not in samples
        for status in ("retrying", "dead"):
            key = ("webhook_receiver_failed_events", labels(source=source, status=status))
            assert samples[key] == 0
        for kind in RepairKind.values:
            key = ("webhook_receiver_repair_items_open", labels(source=source, kind=kind))
            assert samples[key] == 0
    assert (
        "webhook_receiver_rejected_total",
        labels(source="unknown", reason="unknown_source"),
    ) in (samples)


@pytest.mark.django_db
def test_hostile_slugs_all_count_as_unknown_and_never_fail(client, metrics_on):
    # given
    before = scrape(client)
    slugs = ["x" * 3000, "ünïcødé", 'q"uote', "back\\slash", "{brace}", "shop ", "SHOP", "%00"]
    body = reserved("ord_1", ("SKU-1", 1))

    # when
    answers = [post(client, slug, body, standard_headers(body)).status_code for slug in slugs]
    after = scrape(client)

    # then: refused as unknown, one series for them all, no label from the URL
    assert answers == [404] * len(slugs)
    assert delta(before, after, "webhook_receiver_rejected_total") == {
        labels(source="unknown", reason="unknown_source"): len(slugs)
    }
    # no series appeared with a label taken from these URLs (series of sources that other
    # tests configured may already be in this process's registry: only new ones count)
    new_sources = {dict(lbl).get("source") for (_, lbl) in after.keys() - before.keys()}
    assert new_sources - {None} <= {*SOURCES, "unknown"}
    assert not any(dict(lbl).get("source") in slugs for (_, lbl) in after)


class _Broken:
    """A metric whose every write fails, as one would on a full or missing disk."""

    def labels(self, *values: str):
        raise OSError("No space left on device")


@pytest.mark.django_db
def test_a_metric_that_cannot_be_written_changes_no_answer(client, monkeypatch, caplog):
    # given
    monkeypatch.setattr(metrics, "EVENTS", _Broken())
    monkeypatch.setattr(metrics, "REJECTED", _Broken())
    body = reserved("ord_1", ("SKU-1", 1))

    # when
    applied = post(client, "shop", body, standard_headers(body, msg_id="m_ok"))
    refused = post(client, "shop", body, {})

    # then: the answers are the usual ones, the effect committed, and the fault is logged
    assert applied.status_code == 200 and applied.json()["status"] == "applied"
    assert refused.status_code == 400
    assert WebhookReceipt.objects.filter(event_key="m_ok").exists()
    assert "webhook metrics not recorded" in caplog.text


# --- gauges against the tables ---------------------------------------------------------


def _failed(source: str, key: str, status: str, **fields) -> FailedEvent:
    now = timezone.now()
    defaults = {"first_attempt_at": now, "last_attempt_at": now, "next_attempt_at": None}
    return FailedEvent.objects.create(
        source=source, event_key=key, status=status, body=b"{}", **{**defaults, **fields}
    )


@pytest.mark.django_db
def test_database_gauges_equal_the_database(client, metrics_on):
    # given: failed events of every status, one due 15 minutes ago
    now = timezone.now()
    retrying = FailureStatus.RETRYING
    _failed("shop", "r1", retrying, next_attempt_at=now - timedelta(minutes=15))
    _failed("shop", "r2", retrying, next_attempt_at=now - timedelta(minutes=2))
    _failed("shop", "r3", retrying, next_attempt_at=now + timedelta(minutes=5))
    _failed("stripe", "r4", retrying, next_attempt_at=now + timedelta(minutes=5))
    _failed("shop", "d1", FailureStatus.DEAD)
    _failed("github", "d2", FailureStatus.DEAD)
    _failed("github", "d3", FailureStatus.DEAD)
    _failed("shop", "ok", FailureStatus.RESOLVED)
    _failed("shop", "gone", FailureStatus.DISCARDED)
    _failed("retired", "x", FailureStatus.DEAD)  # a source no longer configured
    # and an accepted event, silence alerts (stripe's open), repair items
    body = reserved("ord_1", ("SKU-1", 1))
    assert post(client, "keyed", body, standard_headers(body)).status_code == 200
    SilenceAlert.objects.create(
        source="stripe", opened_at=now, silence_after_seconds=1200, last_checked_at=now
    )
    SilenceAlert.objects.create(
        source="shop",
        opened_at=now - timedelta(hours=2),
        silence_after_seconds=1200,
        last_checked_at=now,
        resolved_at=now - timedelta(hours=1),
    )
    run = needs_repair_run(now)
    for key, source, kind, status in [
        ("a", "shop", "missing", "open"),
        ("b", "shop", "missing", "open"),
        ("c", "shop", "state_mismatch", "open"),
        ("d", "stripe", "failed", "open"),
        ("e", "shop", "missing", "resolved"),
    ]:
        repair(source, kind, key, run, status)

    # when
    samples = scrape(client)
    scraped_at = timezone.now()

    # then: failed events, per source and status, as the table counts them
    open_failed = Counter(
        FailedEvent.objects.filter(source__in=SOURCES, status__in=["retrying", "dead"])
        .values_list("source", "status")
        .order_by()
    )
    assert series(samples, "webhook_receiver_failed_events") == {
        labels(source=s, status=st): open_failed[(s, st)]
        for s in SOURCES
        for st in ("retrying", "dead")
    }
    assert open_failed[("shop", "retrying")] == 3 and open_failed[("github", "dead")] == 2
    # the most overdue retry, per source: shop's was due 15 minutes ago, stripe's is not due
    due = FailedEvent.objects.filter(source="shop", status="retrying").aggregate(
        due=Min("next_attempt_at")
    )["due"]
    age = value(samples, "webhook_receiver_oldest_retry_age_seconds", source="shop")
    assert (now - due).total_seconds() <= age <= (scraped_at - due).total_seconds()
    assert 15 * 60 <= age < 15 * 60 + 30
    assert value(samples, "webhook_receiver_oldest_retry_age_seconds", source="stripe") == 0
    # and whether retries run, as the status's retries_stalled says: 15 min overdue is
    # past the sweep's pickup (about 30 s)
    stalled = {s.source: "retries_stalled" in [r.code for r in s.reasons] for s in statuses()}
    assert series(samples, "webhook_receiver_retries_stalled") == {
        labels(source=s): int(stalled[s]) for s in SOURCES
    }
    assert stalled["shop"] and not stalled["stripe"]
    # the last accepted event, as status.last_accepted_at defines it
    last_events = {
        labels(source=s): last_accepted_at(s).timestamp()
        for s in SOURCES
        if last_accepted_at(s) is not None
    }
    assert series(samples, "webhook_receiver_last_event_timestamp_seconds") == pytest.approx(
        last_events, abs=1e-3
    )
    # keyed's receipt; shop's, github's and stripe's failed events (captured: accepted)
    assert {dict(s)["source"] for s in last_events} == {"keyed", "shop", "github", "stripe"}
    # open silence alerts: stripe's only
    assert series(samples, "webhook_receiver_silence_alert_open") == {
        labels(source=s): (1 if s == "stripe" else 0) for s in SOURCES
    }
    # open repair items, per source and kind
    open_items = Counter(
        RepairItem.objects.filter(status="open").values_list("source", "kind").order_by()
    )
    assert series(samples, "webhook_receiver_repair_items_open") == {
        labels(source=s, kind=k): open_items[(s, k)] for s in SOURCES for k in RepairKind.values
    }
    assert open_items[("shop", "missing")] == 2
    # nothing of the retired source
    assert not any(dict(lbl).get("source") == "retired" for (_, lbl) in samples)


# --- a database that does not answer ---------------------------------------------------


class Locks:
    """Another session, which takes tables from this one until it lets go."""

    def __init__(self) -> None:
        db = connection.settings_dict
        self.other = psycopg.connect(
            dbname=db["NAME"], host=db["HOST"], port=db["PORT"] or None, user=db["USER"]
        )

    def take(self, *tables: str) -> None:
        self.other.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")

    def release(self) -> None:
        self.other.rollback()


@pytest.fixture
def locks(monkeypatch) -> Iterator[Locks]:
    """This session gives up on a lock after 200 ms (PostgreSQL's lock_timeout)."""
    options = {**connection.settings_dict.get("OPTIONS", {}), "options": "-c lock_timeout=200"}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    connection.close()
    held = Locks()
    yield held
    held.release()
    held.other.close()
    connection.close()


@pytest.mark.postgres_only("a lock held by another session")
@pytest.mark.django_db(transaction=True)
def test_a_scrape_the_database_cannot_answer_fails_with_503(client, metrics_on, locks):
    # given
    locks.take("webhook_receiver_failedevent")

    # when
    response = client.get("/metrics/", **AUTH)

    # then: a failed scrape (Prometheus sees it), not a page of gauges with holes
    assert response.status_code == 503
    assert b"webhook_receiver" not in response.content
    locks.release()
    assert client.get("/metrics/", **AUTH).status_code == 200


@pytest.mark.postgres_only("a lock held by another session")
@pytest.mark.django_db(transaction=True)
def test_a_request_answered_503_counts_as_temporarily_unavailable(
    client, settings, metrics_on, locks
):
    # given: an event that can be neither claimed nor captured
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "LOCK_TIMEOUT_MS": 200}
    before = scrape(client)
    locks.take("webhook_receiver_webhookreceipt", "webhook_receiver_failedevent")
    body = reserved("ord_1", ("SKU-1", 1))

    # when
    response = post(client, "shop", body, standard_headers(body))
    locks.release()
    after = scrape(client)

    # then: counted as the audit trail has it, and timed
    assert response.status_code == 503
    assert RequestAudit.objects.filter(source="shop", response_status=503).count() == 1
    assert delta(before, after, "webhook_receiver_rejected_total") == {
        labels(source="shop", reason="temporarily_unavailable"): 1
    }
    assert delta(before, after, "webhook_receiver_events_total") == {}
    assert delta(before, after, "webhook_receiver_receive_seconds_count") == {
        labels(source="shop"): 1
    }


# --- the token -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x", "Bearer ünï"],
)
def test_without_the_right_token_the_answer_is_401(client, metrics_on, authorization):
    extra = {"HTTP_AUTHORIZATION": authorization} if authorization is not None else {}

    response = client.get("/metrics/", **extra)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"webhook_receiver" not in response.content


@pytest.mark.django_db
def test_without_a_configured_token_metrics_are_off(client, settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "METRICS_TOKEN": None}

    assert client.get("/metrics/").status_code == 404
    assert client.get("/metrics/", **AUTH).status_code == 404


@pytest.mark.django_db
def test_only_get_is_served(client, metrics_on):
    for method in ("post", "put", "delete"):
        response = getattr(client, method)("/metrics/", **AUTH)
        assert response.status_code == 405
        assert response["Allow"] == "GET"


@pytest.mark.django_db
def test_a_scraper_needs_no_login_nor_csrf_token(settings, metrics_on):
    # given: a host that requires login everywhere (Django 5.1+), and CSRF checks on
    from django.test import Client

    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE,
        "django.contrib.auth.middleware.LoginRequiredMiddleware",
    ]
    client = Client(enforce_csrf_checks=True)

    # when
    response = client.get("/metrics/", **AUTH)

    # then
    assert response.status_code == 200
    assert b"webhook_receiver_events_total" in response.content


@pytest.mark.django_db
@THROUGH_THE_DATABASE
@given(
    authorization=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
)
def test_any_authorization_header_on_metrics_is_a_401_or_the_scrape(
    client, settings, authorization
):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "METRICS_TOKEN": "fuzz-token"}
    response = client.get("/metrics/", HTTP_AUTHORIZATION=authorization)
    expected = (
        200
        if authorization.partition(" ")[2].strip() == "fuzz-token"
        and (authorization.partition(" ")[0].lower() == "bearer")
        else 401
    )
    assert response.status_code == expected
