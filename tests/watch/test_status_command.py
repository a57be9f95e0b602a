"""``manage.py webhook_status``: its lines, its JSON, and its exit code for each state
(0 ok, 1 attention, 2 alert, 3 the status could not be read). The command reads the
clock itself: records are placed relative to the real now."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from tests.support.status import accepted, failed, refused, silence, status_command
from webhook_receiver.watch.heartbeat import record_heartbeat

pytestmark = pytest.mark.django_db

SOURCES = ["shop", "stripe", "github", "small", "keyed"]  # tests/settings.py, in order
# the error a dropped table gives, on each engine
DROPPED = "UndefinedTable" if connection.vendor == "postgresql" else "OperationalError"


@pytest.fixture
def time_machine_now():
    """The command reads the clock itself: records are placed relative to the real now."""
    from django.utils import timezone

    return timezone.now()


def test_command_all_ok_exits_0(time_machine_now):
    accepted("shop", time_machine_now - timedelta(minutes=2))

    code, out = status_command()

    assert code == 0
    lines = out.splitlines()
    assert lines[1] == "OK: All 5 sources OK"
    header = lines[3].split()
    assert header[:4] == ["SOURCE", "STATE", "LAST", "ACCEPTED"]
    shop = next(line for line in lines if line.startswith("shop "))
    assert shop.split()[:5] == ["shop", "OK", "2", "min", "ago"]
    assert "1 / 0" in shop


def test_command_attention_exits_1_and_says_why(time_machine_now):
    failed("shop", "dead", first=time_machine_now - timedelta(hours=1))
    refused("stripe", time_machine_now - timedelta(minutes=1))

    code, out = status_command()

    assert code == 1
    assert (
        "ATTENTION: 2 sources need attention: shop — 1 dead letter; stripe — 1 request refused\n"
        in out
    )
    assert "\nshop: ATTENTION\n  ATTENTION  1 dead letter\n" in out
    assert "\nstripe: ATTENTION\n  ATTENTION  1 request refused in the last hour" in out


def test_command_alert_exits_2(time_machine_now):
    silence("github", opened=time_machine_now - timedelta(minutes=3), last=None)

    code, out = status_command()

    assert code == 2
    assert "ALERT: 1 source in alert: github — silent, never sent an event" in out
    assert "  ALERT      silent: no accepted event ever (window 20 min)" in out
    github = next(line for line in out.splitlines() if line.startswith("github "))
    assert "ALERT" in github and "open 3 min" in github


def test_command_json_shape(time_machine_now):
    # given: one of everything on shop
    now = time_machine_now
    accepted("shop", now - timedelta(minutes=2))
    refused("shop", now - timedelta(minutes=1))
    failed("shop", "retrying", first=now - timedelta(minutes=5), due=now + timedelta(minutes=1))
    failed("shop", "dead", first=now - timedelta(hours=2))

    # when
    code, out = status_command("--json")

    # then: valid JSON with the documented keys (docs/watching.md)
    document = json.loads(out)
    assert code == 1 == document["exit_code"]
    assert set(document) == {
        "generated_at",
        "state",
        "verdict",
        "exit_code",
        "sources",
        "destinations",
        "reasons",
        "unread",
        "broker",
        "beat",
        "relay",
    }
    assert (document["reasons"], document["unread"]) == ([], [])
    assert document["broker"] == {"reachable": True, "error": None}
    assert document["beat"]["age_seconds"] < 5
    assert document["beat"]["interval_seconds"] == 20.0
    assert document["beat"]["stale_after_seconds"] == 40.0
    assert document["relay"]["age_seconds"] < 5
    assert document["relay"]["stale_after_seconds"] == 30.0
    assert document["destinations"] == []  # no outbox destination here
    assert document["state"] == "attention"
    assert [s["source"] for s in document["sources"]] == SOURCES
    shop = document["sources"][0]
    assert set(shop) == {
        "source",
        "configured",
        "secrets_unreadable",
        "state",
        "reasons",
        "last_accepted_at",
        "last_accepted_age_seconds",
        "last_hour",
        "failed_events",
        "silence",
        "reconciliation",
        "unread",
    }
    assert shop["unread"] == []
    assert shop["state"] == "attention"
    assert [r["code"] for r in shop["reasons"]] == ["dead_letters", "rejected"]
    assert shop["reasons"][0] == {
        "code": "dead_letters",
        "state": "attention",
        "summary": "1 dead letter",
        "text": "1 dead letter",
    }
    assert shop["last_hour"] == {
        "requests": 2,
        "accepted": 1,
        "rejected": 1,
        "accepted_by_result": {"applied": 1},
        "rejected_by_reason": {"invalid_signature": 1},
        "rejected_unrecorded": 0,
    }
    assert shop["failed_events"]["retrying"] == 1
    assert shop["failed_events"]["dead"] == 1
    assert 299 <= shop["failed_events"]["oldest_retry_age_seconds"] <= 310
    assert shop["silence"] == {
        "after_seconds": 1200.0,
        "active_hours": None,
        "in_active_hours": None,
        "open_alert": None,
    }
    assert shop["reconciliation"] == {"last_run": None, "open_repair_items": {}}
    assert 119 <= shop["last_accepted_age_seconds"] <= 130


def test_command_names_what_it_could_not_read_and_shows_the_rest(time_machine_now):
    # given: a real database fault, a table the status reads is gone (rolled back after),
    # and what the other parts show
    failed("shop", "dead", first=time_machine_now - timedelta(hours=2))
    record_heartbeat()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE webhook_receiver_silencealert")
    out, err = io.StringIO(), io.StringIO()

    # when
    with pytest.raises(SystemExit) as exit, transaction.atomic():
        call_command("webhook_status", "--json", stdout=out, stderr=err)

    # then: exit 3 (nothing read is an alert), the part named, the rest shown
    document = json.loads(out.getvalue())
    assert exit.value.code == 3 == document["exit_code"]
    assert document["state"] == "unknown"
    assert document["unread"] == [{"what": "silence alerts", "why": f"database error ({DROPPED})"}]
    assert document["verdict"].startswith(f"Not read: silence alerts: database error ({DROPPED})")
    shop = document["sources"][0]
    assert shop["unread"] == ["silence alerts"]
    assert shop["silence"]["open_alert"] is None
    assert shop["failed_events"]["dead"] == 1  # read, and shown
    assert err.getvalue().strip() == (
        f"webhook_status: not read: silence alerts: database error ({DROPPED})"
    )


def test_the_table_marks_unread_figures_and_the_verdict_is_unknown(time_machine_now):
    record_heartbeat()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE webhook_receiver_failedevent")
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit, transaction.atomic():
        call_command("webhook_status", stdout=out, stderr=io.StringIO(), no_color=True)
    lines = out.getvalue().splitlines()
    assert exit.value.code == 3
    assert lines[1].startswith("UNKNOWN: Not read: failed events: database error")
    shop = next(line for line in lines if line.startswith("shop "))
    # last accepted (receipts and failed events), retrying, dead, oldest retry: unknown
    assert shop.split()[2:9] == ["?", "0", "/", "0", "?", "?", "?"]
