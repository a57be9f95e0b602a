"""Reconciliation against a hostile or broken sender, on real loopback servers and the
real database: NUL in a refusal and in records, an answer that drips or floods, a
Retry-After no number reads, the command's exit status; and the adapters' parsing of
whatever a sender sends, fuzzed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from project.shop.reconcile import OrderStates
from tests.support.peers import answer, dripping, hostile_peer, timed
from tests.support.reconciling import reconcile_with
from webhook_receiver.core import storable
from webhook_receiver.models import ReconciliationRun, RepairItem
from webhook_receiver.reconcile.adapters import SenderEvent, SenderUnavailable, parse_event
from webhook_receiver.reconcile.adapters.file import list_events as file_events
from webhook_receiver.reconcile.adapters.http import list_events as http_events
from webhook_receiver.reconcile.adapters.stripe import sender_event
from webhook_receiver.reconcile.run import reconciliation_run

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PURE = settings(max_examples=300, deadline=None)


def later() -> datetime:
    """A moment from which records created now sit inside the default window."""
    return timezone.now() + timedelta(minutes=15)


def http_source(settings, url: str, **options) -> None:
    reconcile_with(
        settings, "shop", OPTIONS={"URL": url, "RETRIES": 0, "MAX_RETRY_WAIT": 0.1, **options}
    )


def page(records: list[dict], cursor: str | None = None) -> bytes:
    return json.dumps({"data": records, "next_cursor": cursor}).encode()


def record(event_id: str, **data) -> dict:
    return {
        "id": event_id,
        "type": "order.paid",
        "created_at": timezone.now().isoformat(),
        "data": data,
    }


# --- what a sender says is stored safely -------------------------------------------------


def test_a_refusal_with_a_nul_in_its_body_fails_the_run_and_the_next_one_runs(settings):
    # given: a sender answering 400 with a NUL in its body
    body = b'{"error": "bad \x00 request"}'
    with hostile_peer(lambda request: [(0, answer(400, {}, body))]) as peer:
        http_source(settings, peer.url)

        # when
        run = reconciliation_run(source_slug="shop", now=later())

        # then: the run failed, with the refusal stored escaped; it is not left running
        assert run.outcome == "failed"
        run.refresh_from_db()
        assert (run.outcome, run.finished_at is not None) == ("failed", True)
        assert run.error == 'SenderUnavailable: HTTP 400: {"error": "bad \\x00 request"}'

        # and the next run is not refused as "running", and the command exits 2
        assert reconciliation_run(source_slug="shop", now=later()).outcome == "failed"
        out = StringIO()
        with pytest.raises(CommandError) as raised:
            call_command("reconcile", "--source", "shop", stdout=out)
    assert raised.value.returncode == 2
    assert "The run failed: SenderUnavailable: HTTP 400" in out.getvalue()
    assert not ReconciliationRun.objects.filter(outcome="running").exists()


def test_records_holding_nul_and_lone_surrogates_are_stored_escaped(settings):
    # given: a sender listing an event never received whose id, data keys and values
    # hold NUL and a lone surrogate (jsonb refuses both)
    hostile = record(
        "e\x00nul", order_id="o\x00", note="a\x00b", lone="\ud800", huge=1e999, **{"k\x00": 1}
    )
    with hostile_peer(lambda request: [(0, answer(200, {}, page([hostile])))]) as peer:
        http_source(settings, peer.url)

        # when
        run = reconciliation_run(source_slug="shop", now=later())

    # then: the run completed, and its item says what the sender said, escaped
    assert run.outcome == "needs_repair", run.error
    item = RepairItem.objects.get()
    assert item.kind == "missing"
    assert item.event_key == storable.key("e\x00nul")
    assert item.subject == "o\\x00"
    assert item.sender_says["id"] == "e\\x00nul"
    assert item.sender_says["data"] == {
        "order_id": "o\\x00",
        "note": "a\\x00b",
        "lone": "\\ud800",
        "huge": "Infinity",
        "k\\x00": 1,
    }


class ComparisonThatFailsInTheDatabase(OrderStates):
    """A host's STATE_COMPARISON whose query the database refuses, quoting the data."""

    def compare(self, *, source, states):
        with connection.cursor() as cursor:
            for order_id in states:
                cursor.execute("SELECT %s::jsonb", [json.dumps({"order": order_id, "x": "\x00"})])
        return []


def test_a_database_error_is_stored_without_the_data_it_quotes(settings):
    # given: a host comparison that fails in PostgreSQL, whose error's CONTEXT line
    # quotes the record's data (on SQLite: the same failure, a message of its own)
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "STATE_COMPARISON": "tests.reconcile.test_hostile.ComparisonThatFailsInTheDatabase",
    }
    listed = record("e_secret", order_id="ord_secret_data", version=1)
    with hostile_peer(lambda request: [(0, answer(200, {}, page([listed])))]) as peer:
        http_source(settings, peer.url)

        # when
        run = reconciliation_run(source_slug="shop", now=later())

    # then: failed, with the error's first line only: no record data in it
    assert run.outcome == "failed"
    if connection.vendor == "postgresql":
        assert run.error.startswith("DataError: unsupported Unicode escape sequence")
    assert "\n" not in run.error and "CONTEXT" not in run.error
    assert "ord_secret_data" not in run.error


# --- every sender call bounded in time and bytes ------------------------------------------


def test_an_answer_that_drips_fails_the_run_at_its_request_timeout(settings):
    # given: a 200 whose body comes a byte every 0.2 s for 10 s; each read is well
    # within READ_TIMEOUT
    with hostile_peer(dripping(50)) as peer:
        http_source(settings, peer.url, READ_TIMEOUT=5, REQUEST_TIMEOUT=1)

        # when
        run, took = timed(lambda: reconciliation_run(source_slug="shop", now=later()))

    # then
    assert took < 2.5, took
    assert run.outcome == "failed" and "ReadTimeout" in run.error


@pytest.mark.parametrize("framing", ["declared", "chunked"])
def test_an_answer_larger_than_the_page_limit_fails_the_run_unread(settings, framing):
    # given: a 200 of 50 MB, its length declared or chunked
    chunk = b" " * 65536
    total = 50 * 1024 * 1024

    def flood(request: bytes):
        if framing == "declared":
            yield 0, f"HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n".encode()
            for _ in range(total // len(chunk)):
                yield 0, chunk
        else:
            yield 0, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            for _ in range(total // len(chunk)):
                yield 0, b"10000\r\n" + chunk + b"\r\n"

    with hostile_peer(flood) as peer:
        http_source(settings, peer.url, MAX_PAGE_BYTES=1024 * 1024)

        # when
        run, took = timed(lambda: reconciliation_run(source_slug="shop", now=later()))

    # then: failed at once, having read little more than the limit
    assert run.outcome == "failed"
    assert "larger than MAX_PAGE_BYTES (1048576 bytes)" in run.error
    assert peer.written < 10 * 1024 * 1024
    assert took < 5


def test_retries_stop_at_the_total_timeout(settings):
    # given: a sender answering 503 after 0.4 s, every time, and retries to spare
    slow = [(0.4, answer(503, {}, b"busy"))]
    with hostile_peer(lambda request: slow) as peer:
        http_source(settings, peer.url, RETRIES=20, MAX_RETRY_WAIT=0.05, TOTAL_TIMEOUT=1.5)

        # when
        run, took = timed(lambda: reconciliation_run(source_slug="shop", now=later()))

    # then: the whole listing stopped at its bound, with why
    assert took < 2.5, took
    assert run.outcome == "failed" and "TOTAL_TIMEOUT (1.5 s)" in run.error
    assert len(peer.requests) < 6


@pytest.mark.parametrize("value", ["²", "١٢", "1e3", "-5", "Mon, 32 Foo 2026 99:99:99 GMT"])
def test_a_retry_after_that_is_no_number_is_a_backoff(settings, value):
    # given: a 503 with an unreadable Retry-After (a superscript two is a digit to
    # str.isdigit), then the page
    answers = iter([answer(503, {"retry-after": value}, b""), answer(200, {}, page([]))])
    with hostile_peer(lambda request: [(0, next(answers))]) as peer:
        http_source(settings, peer.url, RETRIES=1)

        # when
        run = reconciliation_run(source_slug="shop", now=later())

    # then: retried after the backoff (capped), and the run is fine
    assert run.outcome == "ok", run.error
    assert len(peer.requests) == 2


def test_the_stripe_adapter_is_bounded_in_time_and_bytes(settings):
    # given: a Stripe API that drips its answer, then one that floods
    options = {"API_KEY": "sk_test_local", "TIMEOUT": 1, "MAX_NETWORK_RETRIES": 0}
    with hostile_peer(dripping(40), path="") as peer:
        reconcile_with(
            settings, "stripe", ADAPTER="stripe", OPTIONS={**options, "API_BASE": peer.url}
        )

        # when
        run, took = timed(lambda: reconciliation_run(source_slug="stripe", now=later()))

    # then: over at its timeout, not when the drip ends (8 s)
    assert took < 3, took
    assert run.outcome == "failed" and "APIConnectionError" in run.error

    big = answer(200, {"content-type": "application/json"}, b" " * (2 * 1024 * 1024))
    with hostile_peer(lambda request: [(0, big)], path="") as peer:
        flooded = {**options, "API_BASE": peer.url, "MAX_PAGE_BYTES": 1024 * 1024}
        reconcile_with(settings, "stripe", ADAPTER="stripe", OPTIONS=flooded)
        run = reconciliation_run(source_slug="stripe", now=later())
    assert run.outcome == "failed" and "larger than MAX_PAGE_BYTES" in run.error


def test_a_file_export_that_is_not_utf8_fails_the_run_with_the_line(settings, tmp_path):
    export = tmp_path / "events.jsonl"
    export.write_bytes(json.dumps(record("e1")).encode() + b"\n\xff\xfe{}\n")
    reconcile_with(settings, "shop", ADAPTER="file", OPTIONS={"PATH": str(export)})

    run = reconciliation_run(source_slug="shop", now=later())

    assert run.outcome == "failed" and "line 2 is not JSON" in run.error


# --- fuzzing what a sender may send ---------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
MOMENTS = st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()) | st.text(max_size=30)
RECORDS = (
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.text(max_size=20) | JSON,
            "type": st.text(max_size=20) | JSON,
            "created_at": MOMENTS | JSON,
            "data": JSON,
        },
    )
    | JSON
)


def parsed_or_refused(parse, value) -> SenderEvent | None:
    try:
        return parse(value)
    except SenderUnavailable:
        return None


@PURE
@given(value=RECORDS)
def test_any_record_of_the_http_contract_parses_or_is_refused(value):
    event = parsed_or_refused(parse_event, value)
    assert event is None or (isinstance(event.id, str) and event.created_at.tzinfo is not None)


@PURE
@given(
    value=st.fixed_dictionaries(
        {},
        optional={
            "id": JSON,
            "type": JSON,
            "created": st.integers() | st.floats() | st.text(max_size=12) | JSON,
            "data": JSON | st.fixed_dictionaries({"object": JSON}),
        },
    )
    | JSON
)
def test_any_stripe_event_maps_or_is_refused(value):
    event = parsed_or_refused(sender_event, value)
    assert event is None or isinstance(event.data, dict)


def listing(events_of, **kwargs) -> list[SenderEvent] | None:
    try:
        return [event for batch in events_of(**kwargs) for event in batch]
    except SenderUnavailable:
        return None


def http_listing_of(body: bytes) -> list[SenderEvent] | None:
    """The HTTP adapter's listing of the last hour from a sender answering 200 ``body``."""
    with hostile_peer(lambda request: [(0, answer(200, {}, body))]) as peer:
        now = timezone.now()
        options = {"URL": peer.url, "RETRIES": 0}
        return listing(http_events, options=options, since=now - timedelta(hours=1), until=now)


@FUZZ
@given(body=st.binary(max_size=2000) | JSON.map(lambda value: json.dumps(value).encode()))
def test_any_answer_body_is_a_listing_or_a_refusal(body):
    http_listing_of(body)


@FUZZ
@given(
    page_body=st.lists(RECORDS, max_size=3).map(
        lambda records: json.dumps({"data": records, "next_cursor": None}).encode()
    )
)
def test_any_page_of_records_is_a_listing_or_a_refusal(page_body):
    http_listing_of(page_body)


@FUZZ
@given(content=st.binary(max_size=2000))
def test_any_export_file_is_a_listing_or_a_refusal(tmp_path_factory, content):
    export = tmp_path_factory.mktemp("export") / "events.jsonl"
    export.write_bytes(content)
    now = timezone.now()
    listing(file_events, options={"PATH": str(export)}, since=now - timedelta(hours=1), until=now)


HOSTILE_TEXT = st.text(
    alphabet=st.characters() | st.sampled_from(["\x00", "\ud800", "\udfff", "\u202e"]),
    max_size=12,
)


@FUZZ
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {
                "id": HOSTILE_TEXT.filter(bool),
                "type": HOSTILE_TEXT.map(lambda t: "order." + t),
                "data": st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT | JSON, max_size=4),
            }
        ),
        min_size=1,
        max_size=5,
    )
)
def test_whatever_text_a_sender_lists_the_run_stores_it(settings, tmp_path_factory, records):
    # given: an export of records whose every string may hold NUL, lone surrogates and
    # any other code point (json.dumps escapes them; json.loads gives them back)
    now = timezone.now()
    export = tmp_path_factory.mktemp("export") / "events.jsonl"
    lines = [json.dumps({**r, "created_at": now.isoformat()}) for r in records]
    export.write_text("\n".join(lines) + "\n")
    reconcile_with(settings, "shop", ADAPTER="file", OPTIONS={"PATH": str(export)})

    # when
    run = reconciliation_run(source_slug="shop", now=later())

    # then: the run ends with its findings, never failed for what it had to store
    assert run.outcome in {"ok", "needs_repair"}, run.error
    assert not ReconciliationRun.objects.filter(outcome="running").exists()
