"""A flood of refused requests: the audit bound, the exact counts behind it, and where an
operator sees it (the overview's figures, the chart, silence alerts, metrics).

Beyond REJECTED_AUDIT_PER_MINUTE refusals per source and reason in a minute, a refused
request gets no audit record of its own: its minute's ``RejectionTally`` counts it. So
for every tally, records + unrecorded = requests, and every verified request still has
its record. Requests here run through the real endpoint (Django's test client) or the
receive service, against the real database; the concurrency test uses real threads
against PostgreSQL.
"""

from __future__ import annotations

import io
import logging
import re
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models.functions import TruncMinute
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.settings import WEBHOOK_RECEIVER
from tests.support.http import post
from tests.support.metrics import scrape, series, value
from tests.support.signing import reserved, standard_headers
from webhook_receiver.conf import app_settings
from webhook_receiver.exceptions import MissingSignatureHeaders
from webhook_receiver.inbound import receive as inbound
from webhook_receiver.inbound.audit import AuditDraft, purge_audit_records
from webhook_receiver.inbound.receive import webhook_receive
from webhook_receiver.models import RejectionTally, RequestAudit, WebhookReceipt
from webhook_receiver.watch.silence import rejected_counts
from webhook_receiver.watch.sources import source_statuses
from webhook_receiver.watch.traffic import activity_series

BOUND = 10  # REJECTED_AUDIT_PER_MINUTE's default
UNSIGNED = b'{"type": "inventory.reserved", "data": {"order_id": "ord_flood", "version": 1}}'


@pytest.fixture(autouse=True)
def _fresh_bound_memory() -> Iterator[None]:
    """Each test's minute says that it went past the bound, whatever the test before it
    said in the same minute (the memory is per process)."""
    inbound._past_bound_said.clear()
    yield
    inbound._past_bound_said.clear()


def refused(client, count: int, *, slug: str = "shop") -> None:
    """``count`` unsigned POSTs, as one flooding client sends them."""
    for _ in range(count):
        answer = post(client, slug, UNSIGNED, {})
        assert answer.status_code == 400, answer.content


def records_by_minute(**filters) -> Counter[datetime]:
    rows = (
        RequestAudit.objects.filter(**filters)
        .annotate(minute=TruncMinute("received_at", tzinfo=UTC))
        .values_list("minute", flat=True)
    )
    return Counter(rows)


def assert_tallies_balance(**filters) -> None:
    """Every tally: its records + its unrecorded = its requests, and no more records
    than the bound."""
    recorded = records_by_minute(**filters)
    for tally in RejectionTally.objects.all():
        assert tally.requests - tally.unrecorded == min(tally.requests, BOUND), tally
    by_minute = Counter()
    for tally in RejectionTally.objects.all():
        by_minute[tally.minute] += tally.requests - tally.unrecorded
    assert by_minute == recorded


# --- the bound --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_flood_of_refused_requests_is_recorded_up_to_the_bound_and_counted_whole(client):
    # when: 300 unsigned requests from one client, within a minute or two
    refused(client, 300)

    # then: the first BOUND of each minute have their record; every one is counted
    records = RequestAudit.objects.filter(source="shop")
    minutes = len(records_by_minute(source="shop"))
    assert records.count() <= BOUND * minutes <= 2 * BOUND
    tallies = RejectionTally.objects.filter(source="shop", reason="missing_signature_headers")
    assert sum(t.requests for t in tallies) == 300
    assert sum(t.unrecorded for t in tallies) == 300 - records.count()
    assert_tallies_balance(source="shop")
    # each record is as complete as before the bound existed
    record = records.earliest("id")
    assert (record.verification, record.result, record.response_status) == (
        "missing_signature_headers",
        "missing_signature_headers",
        400,
    )
    assert record.body_sha256 and record.body_size == len(UNSIGNED)


@pytest.mark.django_db
def test_300_random_slugs_make_one_tally_a_minute_and_at_most_the_bound_of_records(client):
    # when: a prober makes up a slug per request
    slugs = [f"probe-{secrets.token_hex(6)}" for _ in range(300)]
    for slug in slugs:
        assert post(client, slug, UNSIGNED, {}).status_code == 404

    # then: the first BOUND of each minute recorded in full, under the slug they used,
    # and one tally row per minute for all of them (the slug is not its key)
    assert RequestAudit.objects.count() <= 2 * BOUND
    tallies = list(RejectionTally.objects.all())
    assert {(t.source, t.reason) for t in tallies} == {("", "unknown_source")}
    assert len(tallies) <= 2
    assert sum(t.requests for t in tallies) == 300
    records = list(RequestAudit.objects.values_list("source", flat=True))
    assert len(records) <= BOUND * len(tallies)
    assert set(records) <= set(slugs)
    assert_tallies_balance()


@pytest.mark.django_db
def test_the_bound_is_per_source_and_reason(client):
    # when: a flood of unsigned requests to shop, then a few forged ones to shop and a few
    # unsigned ones to stripe
    refused(client, 40)
    body = reserved("ord_1", ("SKU-1", 1))
    forged = {**standard_headers(body), "webhook-signature": "v1," + "A" * 43 + "="}
    for _ in range(3):
        assert post(client, "shop", body, forged).status_code == 401
        assert post(client, "stripe", UNSIGNED, {}).status_code == 400

    # then: the flood's bound does not take the others' records
    assert RequestAudit.objects.filter(verification="invalid_signature").count() == 3
    assert RequestAudit.objects.filter(source="stripe").count() == 3
    assert_tallies_balance()


@pytest.mark.django_db
def test_every_authentic_request_keeps_its_record_during_a_flood(client):
    # given: the bound is reached for shop
    refused(client, 30)
    tallied = sum(RejectionTally.objects.values_list("requests", flat=True))

    # when: authentic deliveries arrive, a new one and its redelivery
    body = reserved("ord_1", ("SKU-1", 1))
    with CaptureQueriesContext(connection) as queries:
        first = post(client, "shop", body, standard_headers(body, msg_id="msg_real"))
    again = post(client, "shop", body, standard_headers(body, msg_id="msg_real"))

    # then: both applied and answered, each with its record; and the authentic path
    # does not even read the tallies
    assert (first.status_code, again.status_code) == (200, 200)
    real = RequestAudit.objects.filter(event_key="msg_real").order_by("id")
    assert [r.result for r in real] == ["applied", "duplicate"]
    assert WebhookReceipt.objects.filter(event_key="msg_real").exists()
    assert sum(RejectionTally.objects.values_list("requests", flat=True)) == tallied
    assert not any("rejectiontally" in q["sql"] for q in queries.captured_queries)


@pytest.mark.django_db
def test_a_flood_logs_a_line_per_record_and_one_a_minute_for_the_rest(client, caplog):
    # when: 300 unsigned requests, and one signed that applies
    with caplog.at_level(logging.INFO):
        refused(client, 300)
        body = reserved("ord_logged", ("SKU-L", 1))
        answer = post(client, "shop", body, standard_headers(body, msg_id="msg_logged"))
        assert answer.status_code == 200

    # then: the log is as bounded as the table: one line per refusal recorded, one line
    # for each minute that went past the bound, and no line of Django's per refusal
    lines = [r.getMessage() for r in caplog.records]
    refusals = [line for line in lines if line.startswith("webhook refused:")]
    reason = "missing_signature_headers"
    assert len(refusals) == RequestAudit.objects.filter(verification=reason).count()
    assert all(f"source=shop reason={reason} status=400" in line for line in refusals)
    past = [line for line in lines if line.startswith("webhook refusals past the audit bound")]
    assert len(past) == RejectionTally.objects.filter(unrecorded__gt=0).count() >= 1
    assert not [r for r in caplog.records if r.name == "django.request"]


@pytest.mark.django_db
def test_other_methods_log_no_line_per_request(client, caplog):
    for _ in range(20):
        assert client.get("/webhooks/shop/").status_code == 405
    assert not [r for r in caplog.records if r.name == "django.request"]


@pytest.mark.django_db
def test_the_bound_comes_from_the_settings(client, settings):
    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "REJECTED_AUDIT_PER_MINUTE": 3}

    refused(client, 20)

    tallies = RejectionTally.objects.all()
    assert RequestAudit.objects.count() <= 3 * tallies.count()
    assert sum(t.requests - t.unrecorded for t in tallies) == RequestAudit.objects.count()


@pytest.mark.parametrize("value", [0, -1, "many", None])
def test_the_bound_must_be_a_positive_number(settings, value):
    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "REJECTED_AUDIT_PER_MINUTE": value}
    with pytest.raises(ImproperlyConfigured, match="REJECTED_AUDIT_PER_MINUTE"):
        app_settings()


@pytest.mark.django_db
def test_a_new_minute_starts_a_new_tally_with_records_again():
    # given: the bound reached in one minute
    minute = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    for second in range(BOUND + 5):
        draft(minute + timedelta(seconds=second)).record_refusal(response_status=400)

    # when: the next minute's first refusal
    recorded = draft(minute + timedelta(minutes=1, seconds=2)).record_refusal(response_status=400)

    # then
    assert recorded
    tallies = list(RejectionTally.objects.order_by("minute").values_list("requests", "unrecorded"))
    assert tallies == [(BOUND + 5, 5), (1, 0)]
    assert RequestAudit.objects.count() == BOUND + 1


def draft(at: datetime, *, source: str = "shop") -> AuditDraft:
    audit = AuditDraft(source=source, received_at=at, remote_addr="192.0.2.1")
    audit.verification = "invalid_signature"
    audit.set_body(b"{}")
    return audit


# --- exact under concurrency --------------------------------------------------------------


@pytest.mark.postgres_only("concurrent upserts of one row are PostgreSQL's row locks at work")
@pytest.mark.django_db(transaction=True)
def test_concurrent_refusals_are_each_counted_once():
    # given: 8 threads, each with its own connection, started together
    threads, per_thread = 8, 60
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def flood() -> None:
        try:
            start.wait()
            for _ in range(per_thread):
                with pytest.raises(MissingSignatureHeaders):
                    webhook_receive(
                        source_slug="shop",
                        stream=io.BytesIO(UNSIGNED),
                        content_length=len(UNSIGNED),
                        headers={},
                        remote_addr="198.51.100.7",
                    )
        except BaseException as exc:  # reported below, with the counts
            errors.append(exc)
        finally:
            connection.close()

    # when: they refuse 480 requests at once, mostly into the same minute's row
    workers = [threading.Thread(target=flood) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)

    # then: every refusal counted exactly once, and records + unrecorded balance
    assert errors == []
    tallies = RejectionTally.objects.filter(source="shop", reason="missing_signature_headers")
    assert sum(t.requests for t in tallies) == threads * per_thread
    assert_tallies_balance(source="shop")


@pytest.mark.postgres_only("synchronous_commit is a PostgreSQL setting")
@pytest.mark.django_db(transaction=True)
def test_a_refusal_relaxes_only_a_commit_of_its_own():
    # when: refusals in transactions of their own, then one inside a caller's
    with CaptureQueriesContext(connection) as own:
        for _ in range(BOUND + 2):  # recorded ones, and counted-only ones
            draft(timezone.now()).record_refusal(response_status=401)
    with transaction.atomic(), CaptureQueriesContext(connection) as callers:
        draft(timezone.now()).record_refusal(response_status=401)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            setting = cursor.fetchone()[0]

    # then: each of its own is one statement (after its bounds, sent in the same round
    # trip) that commits without waiting for its flush; the caller's transaction keeps
    # its durability
    bounds = "set_config('lock_timeout'"
    statements = [q["sql"] for q in own.captured_queries if bounds not in q["sql"]]
    assert len(statements) == BOUND + 2
    assert len(own.captured_queries) == 2 * (BOUND + 2)
    assert all("'synchronous_commit', 'off'" in sql for sql in statements)
    assert not any("synchronous_commit" in q["sql"] for q in callers.captured_queries[:2])
    assert setting == "on"


# --- what an operator sees ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_status_and_the_chart_count_every_refusal_of_a_flood(client):
    # when
    refused(client, 120)
    now = timezone.now()

    # then: the last hour's figures and the chart count all 120, not the records alone
    shop = next(s for s in source_statuses(now=now) if s.source == "shop")
    assert shop.rejected_last_hour == {"missing_signature_headers": 120}
    assert shop.unrecorded_last_hour == 120 - RequestAudit.objects.count()
    rejected_reason = next(r for r in shop.reasons if r.code == "rejected")
    assert rejected_reason.summary == "120 requests refused"
    assert "a flood" in rejected_reason.text
    assert sum(b.rejected for b in activity_series(now=now)["shop"]) == 120
    since = now - timedelta(minutes=10)
    assert rejected_counts("shop", since=since, until=now) == {"missing_signature_headers": 120}


@pytest.mark.django_db
def test_the_chart_sums_a_flood_of_unknown_slugs_under_one_series(client):
    for _ in range(50):
        assert post(client, f"x{secrets.token_hex(4)}", UNSIGNED, {}).status_code == 404

    series_ = activity_series(now=timezone.now())

    assert set(series_) == {*app_settings().sources, "(not configured)"}
    assert sum(b.rejected for b in series_["(not configured)"]) == 50


@pytest.mark.django_db
def test_metrics_count_the_unrecorded_without_a_series_per_slug(client, metrics_on):
    # given
    before = scrape(client)

    # when: a flood to a source, and 60 made-up slugs
    refused(client, 30)
    for _ in range(60):
        post(client, f"x{secrets.token_hex(4)}", UNSIGNED, {})
    after = scrape(client)

    # then: what went unrecorded is counted, per configured source or "unknown"
    name = "webhook_receiver_rejected_unrecorded_total"
    unrecorded = sum(RejectionTally.objects.values_list("unrecorded", flat=True))
    grown = {
        labels_: v - before.get((name, labels_), 0.0) for labels_, v in series(after, name).items()
    }
    assert sum(grown.values()) == unrecorded
    assert {dict(k)["source"] for k, v in grown.items() if v} == {"shop", "unknown"}
    # every configured source and reason has its series from the first scrape, and the
    # slugs made none
    assert value(before, name, source="stripe", reason="invalid_signature") == 0
    assert len(series(after, name)) == len(series(before, name))


# --- retention --------------------------------------------------------------------------


@pytest.mark.django_db
def test_tallies_are_purged_with_the_audit_records():
    # given: tallies on both sides of the 30-day retention
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    for days in (45, 31, 29, 1):
        for _ in range(BOUND + 2):
            draft(now - timedelta(days=days)).record_refusal(response_status=401)

    # when
    deleted = purge_audit_records(now=now)

    # then: the old minutes' tallies and records went together
    kept = sorted(RejectionTally.objects.values_list("minute", flat=True))
    assert kept == [now - timedelta(days=29), now - timedelta(days=1)]
    assert deleted == 2 * BOUND + 2
    assert RequestAudit.objects.count() == 2 * BOUND


# --- the overview page ----------------------------------------------------------------------


def a_flood(now: datetime) -> None:
    """Unsigned requests to shop at 600 a minute for 3 hours, and 300 a minute to made-up
    slugs in the last hour, stored as the bound stores them: BOUND records a minute, the
    rest counted in the minute's tally. The minutes at the last hour's edge are left out
    (so that its figures hold whatever the second), which makes 58 minutes in the last
    hour and 120 before it."""
    start = now.replace(second=0, microsecond=0)
    records = []
    for back in [*range(1, 59), *range(62, 182)]:
        minute = start - timedelta(minutes=back)
        floods = [("shop", "shop", "missing_signature_headers", 400, 600)]
        if back < 60:
            floods.append(("", f"probe-{back}", "unknown_source", 404, 300))
        for tally_source, slug, reason, status, n in floods:
            RejectionTally.objects.create(
                minute=minute, source=tally_source, reason=reason, requests=n, unrecorded=n - BOUND
            )
            records += [
                RequestAudit(
                    source=slug,
                    verification=reason,
                    result=reason,
                    response_status=status,
                    received_at=minute + timedelta(seconds=i),
                )
                for i in range(BOUND)
            ]
    RequestAudit.objects.bulk_create(records)


OVERVIEW = "/admin/webhook_receiver/sourceoverview/"


@pytest.mark.django_db
def test_the_overview_shows_a_flood_by_its_counts(admin_client):
    # given: the last hour of a flood, and its last 3 hours
    a_flood(timezone.now())

    # when
    page = admin_client.get(OVERVIEW).content.decode()

    # then: shop's hour counts every refusal, and says most were only counted; the
    # charts' totals count the 3 hours, and the made-up slugs' hour under one name
    assert "34800 refused" in page
    assert "a flood: 34220 counted only" in page
    charts = re.findall(r'wr-chart-name">([^<]+)(.*?)</div>', page)
    totals = {name: re.findall(r">(\d+) (accepted|rejected)<", rest) for name, rest in charts}
    assert totals["shop"] == [("0", "accepted"), ("106800", "rejected")]
    assert totals["(not configured)"] == [("0", "accepted"), ("17400", "rejected")]
    assert page.count('data-source="(not configured)"') == 1


@pytest.mark.django_db(transaction=True)
def test_the_overview_of_a_flood_in_a_browser(admin_browser, live_server):
    from selenium.webdriver.common.by import By

    from tests.support.browser import screenshot

    # given
    a_flood(timezone.now())

    # when
    admin_browser.get(live_server.url + OVERVIEW)

    # then: shop needs attention, for a flood, which its row and the reasons say
    shop = admin_browser.find_element(By.CSS_SELECTOR, 'tr.wr-source-row[data-source="shop"]')
    assert shop.get_attribute("data-state") == "attention"
    assert "a flood: 34220 counted only" in shop.text
    reasons = admin_browser.find_element(By.CSS_SELECTOR, 'tr.wr-reasons[data-source="shop"]')
    assert "34800 requests refused in the last hour" in reasons.text
    assert "a flood" in reasons.text
    screenshot(admin_browser, "overview-flood")
    # the made-up slugs: one chart row, its totals beside it, no sideways scrolling
    unconfigured = admin_browser.find_element(
        By.CSS_SELECTOR, '.wr-chart-row[data-source="(not configured)"]'
    )
    assert "17400 rejected" in unconfigured.text
    width = admin_browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= admin_browser.execute_script("return window.innerWidth")
    admin_browser.execute_script("document.getElementById('wr-charts').scrollIntoView()")
    screenshot(admin_browser, "overview-flood-charts")
