"""Trace one webhook: event_trace and manage.py webhook_trace (the admin's page:
tests/admin/test_trace.py).

Every record is made the way production makes it (tests/support/trace.py): signed
deliveries to the real endpoint (one applied and delivered twice, one moving an order,
one failing into a dead letter through the real retry sweep) and a real reconciliation
run over a file export.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support.failing import CRASH
from tests.support.trace import APPLIED, DEAD, FULFILLED, ORDER, PAID
from webhook_receiver.watch.trace import EffectSection, event_key_sources, event_trace

pytestmark = pytest.mark.usefixtures("shop_effects")


def effect(trace, title_start: str) -> EffectSection:
    (section,) = [s for s in trace.effects if s.title.startswith(title_start)]
    return section


# --- event_trace -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_applied_event_has_every_delivery_its_receipt_and_its_ledger_lines(story):
    # when
    trace = event_trace(source="shop", event_key=APPLIED)

    # then: both deliveries, oldest first
    assert trace.found
    assert [(d.result, d.response_status) for d in trace.deliveries] == [
        ("applied", 200),
        ("duplicate", 200),
    ]
    assert all(d.verification == "verified" for d in trace.deliveries)
    assert trace.deliveries[0].body_size == len(story.applied_body)
    assert trace.deliveries[0].received_at <= trace.deliveries[1].received_at

    # and the receipt, with the first delivery's outcome
    assert trace.receipt is not None
    assert (trace.receipt.status, trace.receipt.subject) == ("applied", ORDER)
    assert trace.receipt.event_type == "inventory.reserved"
    assert trace.receipt.outcome == {"status": "applied", "event_key": APPLIED}

    # and the shop's effects: the two ledger lines, once (the duplicate wrote nothing)
    ledger = effect(trace, "Inventory ledger")
    assert sorted((row[2], row[3], row[4]) for row in ledger.rows) == [
        ("SKU-BLUE", "-1", "reserved"),
        ("SKU-RED", "-2", "reserved"),
    ]
    assert "q=msg_trace_applied" in ledger.admin_url

    # and the order it concerns, which later events moved
    (order,) = effect(trace, "Order state").rows
    assert order[:3] == (ORDER, "fulfilled", "3")
    assert order[4] == f"no: {FULFILLED}"

    # and nothing failed
    assert trace.failed is None
    assert trace.repairs == ()
    assert trace.outbox == ()
    assert trace.summary == "2 deliveries · receipt applied"


@pytest.mark.django_db
def test_the_messages_an_event_admitted_have_their_metadata_beside_them(summarised):
    # when
    trace = event_trace(source="shop", event_key=PAID)

    # then: one section for the destination, each message's metadata as compact JSON
    (section,) = trace.outbox
    assert section.title == "to merchant"
    assert [(row[0], metadata) for row, metadata in section.lines] == [
        (f"summary:{ORDER}:v2", '{"prompt_version":"v3","tokens":812}'),
        (f"order:{ORDER}:paid:v2", ""),
    ]


@pytest.mark.django_db
def test_a_message_the_destinations_filter_left_out_says_so_and_why(filtered):
    # then: the trace says the filter discarded it, and why, where an answer would be
    (section,) = event_trace(source="shop", event_key=PAID).outbox
    ((row, _),) = section.lines
    assert (row[2], row[4]) == ("discarded by filter", "-")  # and no next attempt
    assert row[5] == "metadata.channel is 'pos', not 'web'"
    out = StringIO()
    call_command("webhook_trace", PAID, "--source", "shop", stdout=out)
    assert "discarded by filter" in out.getvalue()
    assert "metadata.channel is 'pos', not 'web'" in out.getvalue()


@pytest.mark.django_db
def test_the_order_state_says_which_event_set_it(story):
    paid = effect(event_trace(source="shop", event_key=PAID), "Order state").rows
    fulfilled = effect(event_trace(source="shop", event_key=FULFILLED), "Order state").rows

    assert [row[4] for row in paid] == [f"no: {FULFILLED}"]
    assert [row[1:5] for row in fulfilled] == [("fulfilled", "3", fulfilled[0][3], "yes")]


@pytest.mark.django_db
def test_a_dead_event_has_its_attempt_history_and_its_repair_item(story):
    # when
    trace = event_trace(source="shop", event_key=DEAD)

    # then: one delivery, deferred; no receipt; the handler's ledger write rolled back
    assert [(d.result, d.response_status) for d in trace.deliveries] == [("deferred", 202)]
    assert trace.receipt is None
    assert effect(trace, "Inventory ledger").rows == []
    # the order it concerns, read from its stored body (there is no receipt)
    assert [row[4] for row in effect(trace, "Order state").rows] == [f"no: {FULFILLED}"]

    # and the failed event, every attempt, without tracebacks
    failed = trace.failed
    assert failed is not None
    assert (failed.status, failed.attempts, failed.event_type) == ("dead", 2, CRASH)
    assert [(a.attempt, a.trigger, a.kind) for a in failed.history] == [
        (1, "delivery", "transient"),
        (2, "retry", "transient"),
    ]
    assert {a.exception for a in failed.history} == {"builtins.RuntimeError"}
    assert failed.history[0].message == "handler crashed after its ledger write"
    assert all(a.traceback == "" for a in failed.history)
    assert all(a.at is not None for a in failed.history)

    # and the repair item reconciliation opened
    assert [(r.kind, r.status) for r in trace.repairs] == [("failed", "open")]
    assert trace.summary == (
        "1 delivery · no receipt · failed event dead after 2 attempts · 1 repair item(s), 1 open"
    )

    # and the tracebacks only when asked for (the admin page folds them away)
    with_tracebacks = event_trace(source="shop", event_key=DEAD, tracebacks=True)
    assert all("Traceback" in a.traceback for a in with_tracebacks.failed.history)


@pytest.mark.django_db
def test_a_key_nothing_holds_is_an_empty_trace_that_says_so(story):
    trace = event_trace(source="shop", event_key="msg_never_sent")

    assert not trace.found
    assert trace.summary == "nothing holds this key"
    assert (trace.deliveries, trace.receipt, trace.failed, trace.repairs) == ((), None, None, ())
    # the shop's sections are there, and empty
    assert [section.rows for section in trace.effects] == [[], []]
    assert event_key_sources(event_key="msg_never_sent") == []


@pytest.mark.django_db
def test_the_same_key_in_another_source_is_its_own_trace(story):
    # when: the shop's key, traced in a source that never sent it
    trace = event_trace(source="stripe", event_key=APPLIED)

    # then: nothing, not even the shop's rows (which carry the key but not its source)
    assert event_key_sources(event_key=APPLIED) == ["shop"]
    assert not trace.found
    assert [section.rows for section in trace.effects] == [[], []]
    assert effect(trace, "Inventory ledger").note == (
        "Rows with this key belong to source shop, not to this one."
    )


@pytest.mark.django_db
def test_a_hook_that_cannot_be_imported_is_a_message_not_an_error(story, settings):
    # given
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "TRACE_EFFECTS": "nowhere.hook"}

    # when
    trace = event_trace(source="shop", event_key=APPLIED)

    # then: the rest of the story is intact
    assert trace.effects == ()
    assert trace.effects_error.startswith(
        "WEBHOOK_RECEIVER['TRACE_EFFECTS'] = 'nowhere.hook' cannot be imported"
    )
    assert len(trace.deliveries) == 2 and trace.receipt is not None


def exploding_hook(*, source: str, event_key: str) -> list[EffectSection]:
    raise LookupError("the shop's database is elsewhere")


@pytest.mark.django_db
def test_a_hook_that_raises_is_a_message_not_an_error(story, settings):
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "TRACE_EFFECTS": f"{__name__}.exploding_hook",
    }

    trace = event_trace(source="shop", event_key=APPLIED)

    assert trace.effects_error.endswith("raised LookupError: the shop's database is elsewhere")
    assert trace.receipt is not None


# --- manage.py webhook_trace -----------------------------------------------------------


@pytest.mark.django_db
def test_the_command_prints_the_story_one_line_per_delivery_and_attempt(story):
    # when
    out = StringIO()
    call_command("webhook_trace", DEAD, "--source", "shop", stdout=out, no_color=True)

    # then
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == f"shop · {DEAD} · {CRASH}"
    assert lines[1] == "1 delivery · no receipt · failed event dead after 2 attempts · " + (
        "1 repair item(s), 1 open"
    )
    attempts = [line for line in lines if "builtins.RuntimeError" in line]
    assert len(attempts) == 2
    assert attempts[0].split()[:1] == ["1"] and " delivery " in attempts[0]
    assert attempts[1].split()[:1] == ["2"] and " retry " in attempts[1]
    assert "Traceback" not in text
    assert "no outbox messages" in text
    deliveries = [line for line in lines if " deferred " in line]
    assert len(deliveries) == 1 and "202" in deliveries[0]


@pytest.mark.django_db
def test_the_command_prints_a_message_s_metadata_under_its_row(summarised):
    out = StringIO()
    call_command("webhook_trace", PAID, "--source", "shop", stdout=out, no_color=True)

    lines = out.getvalue().splitlines()
    summary = next(n for n, line in enumerate(lines) if f"summary:{ORDER}:v2" in line)
    assert lines[summary + 1] == '      metadata: {"prompt_version":"v3","tokens":812}'
    # the message with none has no such line
    assert sum("metadata:" in line for line in lines) == 1
    assert any(f"order:{ORDER}:paid:v2" in line for line in lines[summary + 2 :])


@pytest.mark.django_db
def test_the_command_aligns_its_columns(story):
    out = StringIO()
    call_command("webhook_trace", APPLIED, stdout=out, no_color=True)

    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.strip().startswith("received (UTC)"))
    rows = [line for line in lines if " verified " in line]
    assert len(rows) == 2
    # every row's verification column starts where its header does
    column = header.index("verification")
    assert all(row[column:].startswith("verified") for row in rows)
    assert any("SKU-RED" in line for line in lines)


@pytest.mark.django_db
def test_the_command_exits_1_when_nothing_holds_the_key():
    with pytest.raises(CommandError) as raised:
        call_command("webhook_trace", "msg_nobody", stdout=StringIO())

    assert raised.value.returncode == 1
    assert "Nothing in any source holds the event key 'msg_nobody'" in str(raised.value)


@pytest.mark.django_db
def test_the_command_names_the_sources_that_hold_a_key_missing_from_the_one_asked(story):
    with pytest.raises(CommandError) as raised:
        call_command("webhook_trace", APPLIED, "--source", "stripe", stdout=StringIO())

    assert raised.value.returncode == 1
    assert str(raised.value) == (
        f"Nothing in source 'stripe' holds the event key '{APPLIED}'. Sources that do: shop."
    )
