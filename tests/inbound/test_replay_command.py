"""``manage.py replay_dead_letters``: selection, dry run, the table and the exit status.

The failed events are made by signed deliveries to the real endpoint whose processing
fails, as in production.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers
from tests.support.failing import CRASH, fail_crash, fail_schema, snapshot
from webhook_receiver.inbound.failures import failed_event_discard
from webhook_receiver.models import FailedEvent, FailureStatus, WebhookReceipt

pytestmark = pytest.mark.django_db

LONG_AGO = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)
HEADER = ["id", "source", "event_key", "event_type", "result", "detail"]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("replay_dead_letters", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def table(output: str) -> list[dict[str, str]]:
    """The printed table's rows, by column. Cells hold no double spaces, so split on them."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == HEADER)
    assert set(lines[start + 1].replace(" ", "")) == {"-"}
    found = []
    for line in lines[start + 2 :]:
        cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        if not cells or not cells[0].isdigit():
            break
        found.append(dict(zip(HEADER, cells, strict=False)))
    return found


def ids(output: str) -> list[int]:
    if output.strip() == "No failed events match; nothing to replay.":
        return []
    return [int(row["id"]) for row in table(output)]


def crash_rows(key: str) -> int:
    return InventoryLedgerEntry.objects.filter(sku="CRASH", event_key=key).count()


# --- dry run -----------------------------------------------------------------------------


def test_dry_run_lists_the_dead_and_changes_nothing(client, crash_handler):
    # given
    crash = fail_crash(client, "msg_crash")
    schema = fail_schema(client, "msg_schema")
    before = [snapshot(crash), snapshot(schema)]

    # when
    output = run("--dry-run")

    # then
    assert table(output) == [
        {
            "id": str(crash.pk),
            "source": "shop",
            "event_key": "msg_crash",
            "event_type": CRASH,
            "result": "would replay",
            "detail": "dead, 1 attempt, last error RuntimeError",
        },
        {
            "id": str(schema.pk),
            "source": "shop",
            "event_key": "msg_schema",
            "event_type": "inventory.reserved",
            "result": "would replay",
            "detail": "dead, 1 attempt, last error InvalidPayload",
        },
    ]
    assert "Dry run: 2 would be replayed; nothing was changed." in output
    assert [snapshot(crash), snapshot(schema)] == before
    assert crash_rows("msg_crash") == 0
    assert not WebhookReceipt.objects.exists()


# --- replay ------------------------------------------------------------------------------


def test_replay_after_the_fix_applies_once_then_finds_nothing(client, crash_handler):
    # given: a dead event whose handler works again
    crash = fail_crash(client, "msg_crash")
    assert crash.status == FailureStatus.DEAD

    # when
    output = run()

    # then
    assert table(output) == [
        {
            "id": str(crash.pk),
            "source": "shop",
            "event_key": "msg_crash",
            "event_type": CRASH,
            "result": "applied",
        }
    ]
    assert "Replayed 1: 1 applied." in output
    crash.refresh_from_db()
    assert (crash.status, crash.resolution) == (FailureStatus.RESOLVED, "applied")
    assert crash.last_replayed_by.startswith("cli")
    assert crash.last_replayed_at is not None
    assert crash_rows("msg_crash") == 1
    assert WebhookReceipt.objects.get(source="shop", event_key="msg_crash").status == "applied"

    # when: run again
    again = run()

    # then: nothing is dead any more
    assert again.strip() == "No failed events match; nothing to replay."
    assert crash_rows("msg_crash") == 1


def test_replay_by_id_of_a_resolved_event_does_not_apply_it_again(client, crash_handler):
    # given: a dead event, replayed successfully
    crash = fail_crash(client, "msg_crash")
    run()
    resolved = snapshot(crash)

    # when: replayed again by id (any status is selected by id)
    output = run("--id", str(crash.pk))

    # then: not applied twice, the record keeps how it ended, and the exit status is 0
    [row] = table(output)
    assert row["id"] == str(crash.pk)
    assert row["result"] == "duplicate"  # the claim answers; nothing is applied
    assert crash_rows("msg_crash") == 1
    crash.refresh_from_db()
    assert (crash.status, crash.resolution) == (FailureStatus.RESOLVED, "applied")
    assert crash.resolved_at == resolved[4]


def test_a_failing_replay_exits_non_zero_and_stays_dead(client, crash_handler):
    # given: a permanent error: the same bytes fail the same way
    schema = fail_schema(client, "msg_schema")
    out = io.StringIO()

    # when
    with pytest.raises(CommandError) as excinfo:
        call_command("replay_dead_letters", stdout=out, stderr=io.StringIO())

    # then: the table was printed before the error
    assert excinfo.value.returncode == 1
    assert str(excinfo.value) == "1 of 1 replays failed."
    [row] = table(out.getvalue())
    assert (row["event_key"], row["result"]) == ("msg_schema", "failed")
    assert "lines[0].quantity: Ensure this value is greater than or equal to 1." in row["detail"]
    schema.refresh_from_db()
    assert schema.status == FailureStatus.DEAD
    assert schema.attempts == 2
    assert [e["trigger"] for e in schema.errors][0] == "delivery"
    assert schema.errors[1]["trigger"].startswith("replay by cli")
    assert schema.last_replayed_by.startswith("cli")


def test_one_failure_does_not_stop_the_others(client, crash_handler):
    # given: one that fails first (lower id), one that applies
    schema = fail_schema(client, "msg_schema")
    crash = fail_crash(client, "msg_crash")
    out = io.StringIO()

    # when
    with pytest.raises(CommandError):
        call_command("replay_dead_letters", stdout=out, stderr=io.StringIO())

    # then
    assert [(r["event_key"], r["result"]) for r in table(out.getvalue())] == [
        ("msg_schema", "failed"),
        ("msg_crash", "applied"),
    ]
    assert "Replayed 2: 1 applied, 1 failed." in out.getvalue()
    assert snapshot(crash)[0] == FailureStatus.RESOLVED
    assert snapshot(schema)[0] == FailureStatus.DEAD


def test_a_crash_that_fails_again_on_replay_exits_non_zero(client, crash_handler):
    # given: the dependency is still down for one more attempt
    crash = fail_crash(client, "msg_crash")
    handlers.failures_left["count"] = 1

    # when
    with pytest.raises(CommandError):
        run()

    # then: its attempt rolled back whole, ledger row included
    crash.refresh_from_db()
    assert (crash.status, crash.attempts) == (FailureStatus.DEAD, 2)
    assert crash.errors[-1]["exception"] == "builtins.RuntimeError"
    assert crash_rows("msg_crash") == 0
    assert not WebhookReceipt.objects.filter(event_key="msg_crash").exists()


def test_nothing_matching_exits_zero(db):
    assert run().strip() == "No failed events match; nothing to replay."


# --- selection ---------------------------------------------------------------------------


@pytest.fixture
def failure_ids(client, failures) -> dict[str, int]:
    """The ids of the four-failure set (tests/conftest.py: dead, a crash and a schema
    error on shop and one on stripe; one retrying), and of two more crashes on shop: one
    dead whose first attempt was on 2020-01-01, one discarded."""
    rows = {
        **failures,
        "old_crash": fail_crash(client, "msg_old_crash", order_id="ord_old"),
        "discarded": fail_crash(client, "msg_discarded", order_id="ord_3"),
    }
    failed_event_discard(failed_id=rows["discarded"].pk, actor="someone", reason="test data")
    FailedEvent.objects.filter(pk=rows["old_crash"].pk).update(first_attempt_at=LONG_AGO)
    return {key: row.pk for key, row in rows.items()}


SELECTIONS = [
    ([], ["crash", "old_crash", "schema", "stripe"]),
    (["--source", "stripe"], ["stripe"]),
    (["--source", "shop"], ["crash", "old_crash", "schema"]),
    (["--source", "shop", "--source", "stripe"], ["crash", "old_crash", "schema", "stripe"]),
    (["--type", CRASH], ["crash", "old_crash"]),
    (["--type", "inventory.reserved", "--source", "shop"], ["schema"]),
    (["--since", "2021-06-01"], ["crash", "schema", "stripe"]),
    (["--since", "2019-12-31T23:00:00+00:00"], ["crash", "old_crash", "schema", "stripe"]),
    (["--since", "2020-01-01T12:00:01Z", "--type", CRASH], ["crash"]),
    (["--status", "retrying"], ["retrying"]),
    (
        ["--status", "retrying", "--status", "dead", "--type", CRASH],
        ["crash", "old_crash", "retrying"],
    ),
    (["--status", "discarded"], ["discarded"]),
    (["--status", "discarded", "--source", "stripe"], []),
]


@pytest.mark.parametrize(("args", "expected"), SELECTIONS, ids=lambda v: " ".join(v))
def test_selection(failure_ids, args, expected):
    # when
    output = run("--dry-run", *args)

    # then: the right rows, in id order
    assert ids(output) == sorted(failure_ids[key] for key in expected)


def test_selection_by_id_takes_any_status(failure_ids):
    # when: a retrying and a dead one, by id, with no --status
    output = run(
        "--dry-run", "--id", str(failure_ids["retrying"]), "--id", str(failure_ids["schema"])
    )

    # then
    assert ids(output) == sorted([failure_ids["retrying"], failure_ids["schema"]])


def test_selection_by_id_with_a_status_filters_on_both(failure_ids):
    # when
    output = run("--dry-run", "--id", str(failure_ids["retrying"]), "--status", "dead")

    # then
    assert output.strip() == "No failed events match; nothing to replay."


def test_an_unknown_id_is_reported(failure_ids):
    # given
    err = io.StringIO()
    missing = max(failure_ids.values()) + 1000

    # when
    call_command(
        "replay_dead_letters",
        "--dry-run",
        "--id",
        str(missing),
        "--id",
        str(failure_ids["crash"]),
        stdout=io.StringIO(),
        stderr=err,
    )

    # then
    assert f"no such id, or left out by the other options): {missing}" in err.getvalue()


def test_replay_by_source_and_type_replays_only_those(failure_ids):
    # when
    output = run("--source", "shop", "--type", CRASH)

    # then
    assert [r["result"] for r in table(output)] == ["applied", "applied"]
    statuses = dict(FailedEvent.objects.values_list("pk", "status"))
    assert statuses == {
        failure_ids["crash"]: FailureStatus.RESOLVED,
        failure_ids["old_crash"]: FailureStatus.RESOLVED,
        failure_ids["schema"]: FailureStatus.DEAD,
        failure_ids["stripe"]: FailureStatus.DEAD,
        failure_ids["retrying"]: FailureStatus.RETRYING,
        failure_ids["discarded"]: FailureStatus.DISCARDED,
    }


@pytest.mark.parametrize("since", ["yesterday", "2024-13-01", "2024-02-30", "2024-05-01T25:00"])
def test_a_bad_since_is_refused_clearly(failure_ids, since):
    # when
    with pytest.raises(CommandError) as excinfo:
        run("--since", since)

    # then: nothing was replayed
    assert str(excinfo.value).startswith(f"--since {since!r} is not an ISO date or datetime")
    assert not FailedEvent.objects.exclude(last_replayed_by="").exists()


def test_an_unknown_status_is_refused(failure_ids):
    with pytest.raises(CommandError, match="invalid choice: 'resolved'"):
        run("--status", "resolved")
    assert not FailedEvent.objects.exclude(last_replayed_by="").exists()
