"""Reconciliation against a sender's record of truth, served by a real local HTTP server
(the http adapter) or read from a JSON-lines export (the file adapter)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from project.shop.models import OrderState
from tests.support.failing import fail_schema
from tests.support.http import post
from tests.support.peers import Chunks, answer, hostile_peer, parsed
from tests.support.reconciling import reconcile_with
from tests.support.signing import event_body, reserved, standard_headers
from tests.support.threads import run_together
from webhook_receiver.models import ReconciliationRun, RepairItem
from webhook_receiver.reconcile.run import RunInProgress, reconciliation_run

pytestmark = pytest.mark.django_db

TOKEN = "sender-api-token"


def json_answer(status: int, body: bytes, delay: float = 0.0) -> Chunks:
    return [(delay, answer(status, {"Content-Type": "application/json"}, body))]


@dataclass
class Sender:
    """The http contract: pages of records, a cursor, a bearer token; or misbehaviour."""

    base_url: str = ""
    records: list[dict] = field(default_factory=list)
    page_size: int = 2
    mode: str = "ok"  # ok | slow | error | garbage
    requests: list[dict] = field(default_factory=list)

    def script(self, raw: bytes) -> Chunks:
        request = parsed(raw)
        auth = request.headers.get("authorization")
        self.requests.append({"query": request.query, "auth": auth})
        if auth != f"Bearer {TOKEN}":
            return json_answer(401, b'{"error": "unauthorized"}')
        if self.mode == "error":
            return json_answer(500, b"oops")
        if self.mode == "garbage":
            return json_answer(200, b"<html>not json</html>")
        gte = datetime.fromisoformat(request.query["created_gte"])
        lt = datetime.fromisoformat(request.query["created_lt"])
        listed = [r for r in self.records if gte <= datetime.fromisoformat(r["created_at"]) < lt]
        start = int(request.query.get("cursor", 0))
        page = listed[start : start + self.page_size]
        more = start + self.page_size < len(listed)
        body = {"data": page, "next_cursor": str(start + self.page_size) if more else None}
        return json_answer(200, json.dumps(body).encode(), delay=3 if self.mode == "slow" else 0)


def http_options(base_url: str, **more: Any) -> dict[str, Any]:
    """The http adapter's options for the local sender: quick to give up."""
    return {
        "URL": f"{base_url}/events",
        "TOKEN": TOKEN,
        "READ_TIMEOUT": 1,
        "RETRIES": 1,
        "MAX_RETRY_WAIT": 0.1,
        **more,
    }


@pytest.fixture
def sender(settings) -> Iterator[Sender]:
    sender = Sender()
    with hostile_peer(sender.script, path="") as peer:
        sender.base_url = peer.url
        reconcile_with(settings, "shop", OPTIONS=http_options(peer.url))
        settings.WEBHOOK_RECEIVER = {
            **settings.WEBHOOK_RECEIVER,
            "STATE_COMPARISON": "project.shop.reconcile.OrderStates",
        }
        yield sender


def listed(event_id: str, body: bytes, created_at: datetime) -> dict:
    """The sender's record of an event it delivered with ``body``."""
    event = json.loads(body)
    return {
        "id": event_id,
        "type": event["type"],
        "created_at": created_at.isoformat(),
        "data": event["data"],
    }


def deliver(client, event_id: str, body: bytes) -> None:
    assert post(client, "shop", body, standard_headers(body, msg_id=event_id)).status_code in (
        200,
        202,
    )


def later() -> datetime:
    """A moment from which the events just delivered sit inside the default window."""
    return timezone.now() + timedelta(minutes=15)


def items() -> dict[tuple[str, str], RepairItem]:
    return {(i.kind, i.event_key): i for i in RepairItem.objects.filter(status="open")}


def test_every_kind_of_difference_is_found_across_pages(client, sender):
    # given: what we received, and what the sender says it sent (pages of 2)
    now = timezone.now()
    applied = reserved("o1", ("S", 1))
    paid_v2 = event_body("order.paid", order_id="o2", version=2)
    paid_v1 = event_body("order.paid", order_id="o3", version=1)
    for event_id, body in [("e_applied", applied), ("e_paid", paid_v2), ("e_ours", paid_v1)]:
        deliver(client, event_id, body)
    fail_schema(client, "e_failed")  # a dead letter
    never_arrived = event_body("order.paid", order_id="o2", version=3)
    sender.records = [
        listed("e_applied", applied, now),
        listed("e_paid", paid_v2, now),
        listed("e_failed", reserved("ord_bad", ("SKU-1", 0)), now),
        listed("e_missing", never_arrived, now),
    ]

    # when
    run = reconciliation_run(source_slug="shop", now=later())

    # then
    assert run.outcome == "needs_repair", run.error
    assert run.sender_records == 4
    found = items()
    assert set(found) == {
        ("missing", "e_missing"),
        ("failed", "e_failed"),
        ("unexpected", "e_ours"),
        ("state_mismatch", "state:o2"),
    }
    assert found[("failed", "e_failed")].we_hold == {"failed_event": "dead"}
    assert found[("missing", "e_missing")].subject == "o2"
    assert found[("state_mismatch", "state:o2")].sender_says == {"status": "paid", "version": 3}
    assert found[("state_mismatch", "state:o2")].we_hold == {"status": "paid", "version": 2}
    assert run.counts == {
        "missing": 1,
        "failed": 1,
        "unexpected": 1,
        "state_mismatch": 1,
        "resolved": 0,
    }
    assert len(sender.requests) == 2  # two pages, the cursor followed
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in sender.requests)
    # and nothing of the business state moved
    assert OrderState.objects.get(order_id="o2").version == 2


def test_a_consistent_window_reports_nothing(client, sender):
    now = timezone.now()
    body = reserved("o1", ("S", 1))
    deliver(client, "e1", body)
    sender.records = [listed("e1", body, now)]

    run = reconciliation_run(source_slug="shop", now=later())

    assert (run.outcome, run.counts) == ("ok", {"resolved": 0})
    assert not RepairItem.objects.exists()


def test_events_at_the_edges_of_the_window_are_not_reported(client, sender):
    # given: the window [start, end); the sender created one event just before the start
    # (we received it just after: in flight across the edge), and one just after the end
    end = timezone.now() - timedelta(seconds=1)
    start = end - timedelta(hours=1)
    early = reserved("o1", ("S", 1))
    deliver(client, "e_early", early)
    sender.records = [
        listed("e_early", early, start - timedelta(seconds=30)),
        listed("e_late", reserved("o2", ("S", 1)), end + timedelta(seconds=30)),
    ]

    # when: the window holds our receipt of e_early, and neither sender event
    run = reconciliation_run(source_slug="shop", since=start, until=end + timedelta(seconds=2))

    # then: e_early is listed within the margin, so it is not unexpected; e_late is
    # outside the window, so it is not missing
    assert run.outcome == "ok", (run.counts, items())


def test_reruns_and_overlapping_windows_never_duplicate_and_a_fixed_item_resolves(client, sender):
    # given: one missing event, found by a run
    now = timezone.now()
    body = reserved("o9", ("S", 1))
    sender.records = [listed("e_late_delivery", body, now)]
    first = reconciliation_run(source_slug="shop", now=later())
    overlapping = reconciliation_run(source_slug="shop", now=later() + timedelta(minutes=5))
    assert RepairItem.objects.count() == 1
    item = RepairItem.objects.get()
    assert (item.first_run, item.last_run) == (first, overlapping)

    # when: the sender's redelivery arrives, and the next run comes
    deliver(client, "e_late_delivery", body)
    fixed = reconciliation_run(source_slug="shop", now=later() + timedelta(minutes=10))

    # then
    item.refresh_from_db()
    assert (item.status, item.resolution_note) == ("resolved", "resolved: now consistent")
    assert fixed.outcome == "ok"
    assert fixed.counts["resolved"] == 1


@pytest.mark.parametrize(
    "mode, error",
    [("slow", "ReadTimeout"), ("error", "HTTP 500, after 2 attempts"), ("garbage", "not JSON")],
)
def test_a_broken_sender_fails_the_run_quickly_with_its_reason(client, sender, mode, error):
    sender.mode = mode
    started = time.monotonic()

    run = reconciliation_run(source_slug="shop", now=later())

    assert run.outcome == "failed"
    assert error in run.error
    assert time.monotonic() - started < 5
    assert not RepairItem.objects.exists()


@pytest.mark.parametrize("token", ["wrong", ""], ids=["wrong token", "no token"])
def test_a_refused_token_fails_the_run_without_retrying(client, sender, settings, token):
    reconcile_with(settings, "shop", OPTIONS=http_options(sender.base_url, TOKEN=token))

    run = reconciliation_run(source_slug="shop", now=later())

    assert run.outcome == "failed"
    assert "HTTP 401" in run.error
    assert len(sender.requests) == 1


def test_one_run_per_source_at_a_time_and_an_abandoned_one_is_closed(sender):
    now = timezone.now()
    running = ReconciliationRun.objects.create(
        source="shop", window_start=now, window_end=now, started_at=now, outcome="running"
    )
    with pytest.raises(RunInProgress):
        reconciliation_run(source_slug="shop", now=now + timedelta(minutes=1))

    # an hour later it was abandoned (its worker was killed): the next start closes it
    run = reconciliation_run(source_slug="shop", now=now + timedelta(hours=2))
    running.refresh_from_db()
    assert running.outcome == "failed"
    assert running.error.startswith("abandoned")
    assert run.outcome == "ok"


def test_the_file_adapter_reads_a_json_lines_export(client, settings, tmp_path):
    now = timezone.now()
    body = reserved("o1", ("S", 1))
    deliver(client, "e_in_file", body)
    export = tmp_path / "events.jsonl"
    export.write_text(
        json.dumps(listed("e_in_file", body, now))
        + "\n\n"
        + json.dumps(listed("e_only_there", body, now))
        + "\n"
    )
    reconcile_with(settings, "shop", ADAPTER="file", OPTIONS={"PATH": str(export), "PAGE_SIZE": 1})

    run = reconciliation_run(source_slug="shop", now=later())

    assert set(items()) == {("missing", "e_only_there")}
    assert run.sender_records == 2


def test_the_command_prints_the_repair_list_and_exits_with_what_it_found(client, sender):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    now = timezone.now()
    body = reserved("o7", ("S", 1))
    sender.records = [listed("e_cmd_missing", body, now - timedelta(minutes=30))]
    out = StringIO()

    with pytest.raises(CommandError) as raised:
        call_command("reconcile", "--source", "shop", stdout=out)

    assert raised.value.returncode == 1
    text = out.getvalue()
    assert "needs_repair" in text
    assert "missing  e_cmd_missing" in text
    # json, for scripts
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("reconcile", "--source", "shop", "--format", "json", stdout=out)
    report = json.loads(out.getvalue())
    assert [item["event_key"] for item in report["items"]] == ["e_cmd_missing"]
    # a sender that fails: exit status 2
    sender.mode = "error"
    with pytest.raises(CommandError) as raised:
        call_command("reconcile", "--source", "shop", stdout=StringIO())
    assert raised.value.returncode == 2


def test_the_beat_task_runs_every_configured_source(client, sender):
    from webhook_receiver.tasks import reconcile_sources_task

    assert reconcile_sources_task() == {"shop": "ok"}
    assert ReconciliationRun.objects.get().outcome == "ok"


def test_runs_and_items_are_shown_read_only_in_the_admin(client, admin_client, sender):
    from django.urls import reverse

    sender.records = [listed("e_admin", reserved("o8", ("S", 1)), timezone.now())]
    reconciliation_run(source_slug="shop", now=later())
    item = RepairItem.objects.get()

    runs = admin_client.get(reverse("admin:webhook_receiver_reconciliationrun_changelist"))
    found = admin_client.get(
        reverse("admin:webhook_receiver_repairitem_changelist"), {"q": "e_admin"}
    )
    detail = admin_client.get(reverse("admin:webhook_receiver_repairitem_change", args=[item.pk]))

    assert runs.status_code == found.status_code == detail.status_code == 200
    assert b"needs_repair" in runs.content or b"Needs repair" in runs.content
    assert b"e_admin" in found.content
    assert b"the sender says" in detail.content.lower()
    add = admin_client.get(reverse("admin:webhook_receiver_repairitem_add"))
    assert add.status_code == 403


@dataclass
class StripeEvents:
    """Stripe's Events list, as far as the SDK reads it: created[gte]/[lt], limit,
    starting_after, has_more."""

    events: list[dict]
    requests: list[dict] = field(default_factory=list)

    def script(self, raw: bytes) -> Chunks:
        query = parsed(raw).query
        self.requests.append(query)
        gte, lt = int(query["created[gte]"]), int(query["created[lt]"])
        listed = [e for e in self.events if gte <= e["created"] < lt]
        if "starting_after" in query:
            ids = [e["id"] for e in listed]
            listed = listed[ids.index(query["starting_after"]) + 1 :]
        limit = int(query.get("limit", 10))
        body = {
            "object": "list",
            "url": "/v1/events",
            "has_more": len(listed) > limit,
            "data": listed[:limit],
        }
        return json_answer(200, json.dumps(body).encode())


def test_the_stripe_adapter_reads_the_events_list_through_the_sdk(client, settings):
    from tests.support.signing import stripe_headers

    # given: a local server speaking Stripe's Events list, 150 events (two pages of 100),
    # one of which we received
    now = timezone.now()
    applied = json.dumps(
        {"id": "evt_0", "type": "order.paid", "data": {"order_id": "s1", "version": 1}}
    ).encode()
    assert post(client, "stripe", applied, stripe_headers(applied)).status_code == 200
    stripe = StripeEvents(
        [
            {
                "id": f"evt_{n}",
                "object": "event",
                "type": "customer.updated",
                "created": int(now.timestamp()),
                "data": {"object": {"id": f"cus_{n}"}},
            }
            for n in range(150)
        ]
    )

    # when
    with hostile_peer(stripe.script, path="") as api:
        options = {"API_KEY": "sk_test_local", "API_BASE": api.url}
        reconcile_with(settings, "stripe", ADAPTER="stripe", OPTIONS=options)
        run = reconciliation_run(source_slug="stripe", now=later())

    # then: 149 missing (keyed by the Stripe event id, as the receive path keys them)
    assert run.outcome == "needs_repair", run.error
    assert run.sender_records == 150
    assert run.counts["missing"] == 149
    assert not RepairItem.objects.filter(event_key="evt_0").exists()
    assert [r.get("starting_after") for r in stripe.requests] == [None, "evt_99"]


STRIPE_REFUSES = (
    b'{"error": {"message": "Invalid API Key provided", "type": "invalid_request_error"}}'
)


def test_a_stripe_key_refused_fails_the_run_with_stripes_reason(settings):
    with hostile_peer(lambda request: json_answer(401, STRIPE_REFUSES), path="") as api:
        options = {"API_KEY": "sk_test_wrong", "API_BASE": api.url}
        reconcile_with(settings, "stripe", ADAPTER="stripe", OPTIONS=options)
        run = reconciliation_run(source_slug="stripe", now=later())

    assert run.outcome == "failed"
    assert "AuthenticationError" in run.error and "Invalid API Key" in run.error


slow_listing_calls: list[float] = []


def slow_listing(*, options, since, until):
    """An adapter whose sender takes a second to answer."""
    slow_listing_calls.append(time.monotonic())
    time.sleep(1)
    yield []


@pytest.mark.postgres_only("two sessions at once on one database")
@pytest.mark.django_db(transaction=True)
def test_two_workers_starting_the_same_source_at_once_run_it_once(settings):
    from django.db import connection

    # given: a source whose sender is slow, and two workers starting it together
    reconcile_with(settings, "shop", ADAPTER="tests.reconcile.test_run.slow_listing")
    slow_listing_calls.clear()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def worker() -> None:
        barrier.wait()
        try:
            outcomes.append(reconciliation_run(source_slug="shop").outcome)
        except RunInProgress:
            outcomes.append("refused: running elsewhere")
        finally:
            connection.close()

    # when
    run_together([threading.Thread(target=worker) for _ in range(2)], timeout=30)

    # then: one ran (its sender was asked once), the database refused the other
    assert sorted(outcomes) == ["ok", "refused: running elsewhere"]
    assert len(slow_listing_calls) == 1
    assert ReconciliationRun.objects.get().outcome == "ok"
