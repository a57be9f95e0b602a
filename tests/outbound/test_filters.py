"""A destination's filter (outbound/filters.py): what it accepts, what it passes and why
not, at admission (a filtered event is a message discarded by ``filter``, with the
reason), a broken filter failing closed for its own destination only, and any event
against any filter answered, never raised."""

from __future__ import annotations

import pytest
from django.core.management import CommandError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.outbox import destination, destination_added, destination_command
from webhook_receiver.admin.forms import DestinationForm
from webhook_receiver.models import MessageStatus, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import destinations_for, enqueue_webhook
from webhook_receiver.outbound.filters import filter_problem, filter_verdict


def body(**data):
    return {"type": "order.paid", "data": {"order_id": "ord-1", "status": "paid", **data}}


@pytest.mark.parametrize(
    ("spec", "payload", "metadata", "verdict"),
    [
        ({"data.status": "paid"}, body(), {}, None),
        ({"data.status": "cancelled"}, body(), {}, "data.status is 'paid', not 'cancelled'"),
        ({"type": {"$startsWith": "order."}}, body(), {}, None),
        ({"data.amount": {"$in": [100, 200]}}, body(amount=200), {}, None),
        ({"data.amount": {"$in": [100]}}, body(amount=True), {}, "not one of [100]"),
        ({"data.amount": {"$eq": 1}}, body(amount="1"), {}, "data.amount is '1', not 1"),
        ({"data.coupon": {"$exist": True}}, body(), {}, "missing, the filter asks that it exist"),
        ({"data.coupon": {"$exist": False}}, body(), {}, None),
        ({"data.status": {"$neq": "paid"}}, body(), {}, "which the filter leaves out"),
        ({"data.status": {"$nin": ["void"]}}, body(), {}, None),
        ({"metadata.channel": "web"}, body(), {"channel": "web"}, None),
        ({"metadata.channel": "web"}, body(), {}, "metadata.channel is missing, not 'web'"),
        (
            {"$or": [{"metadata.channel": "app"}, {"data.status": "void"}]},
            body(),
            {},
            "none of $or: metadata.channel is missing, not 'app'; data.status is 'paid', "
            "not 'void'",
        ),
        ({"$and": [{"type": "order.paid"}, {"data.status": "paid"}]}, body(), {}, None),
        ({"data.status": "paid"}, {"type": "order.paid", "data": ["x"]}, {}, "is missing"),
    ],
)
def test_what_a_filter_passes_and_why_not(spec, payload, metadata, verdict):
    assert filter_problem(spec) is None
    found = filter_verdict(spec, "order.paid", payload, metadata)
    assert found == verdict if verdict is None else verdict in found


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({}, "the filter must be a non-empty JSON object"),
        (["data.status"], "the filter must be a non-empty JSON object"),
        ({"data.a.b": 1}, "'data.a.b' is not a field"),
        ({"payload.x": 1}, "'payload.x' is not a field"),
        ({"data.x": {"$regex": "^a"}}, "'$regex' is not an operator"),
        ({"data.x": {"$in": []}}, "$in takes a non-empty list of plain values"),
        ({"data.x": {"$in": [{"a": 1}]}}, "$in takes a non-empty list of plain values"),
        ({"data.x": {"$exist": 1}}, "$exist takes true or false"),
        ({"data.x": [1, 2]}, "a value to equal is a string, a number"),
        ({"$or": []}, "$or takes a non-empty list of filters"),
        ({"$or": [{"$or": [{}]}]}, "$or #1 must be a non-empty JSON object"),
        ({"data.x": "y" * 5000}, "a filter is at most 4096 bytes"),
    ],
)
def test_a_filter_that_is_not_one_is_named_so(spec, problem):
    assert problem in filter_problem(spec)


def test_a_filter_nested_too_deep_is_refused():
    spec: dict = {"data.x": 1}
    for _ in range(9):
        spec = {"$and": [spec]}
    assert "nested deeper than 8" in filter_problem(spec)


SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
CONDITIONS = SCALARS | st.dictionaries(
    st.sampled_from(["$eq", "$neq", "$in", "$nin", "$startsWith", "$exist", "$x"]),
    JSON,
    min_size=1,
    max_size=3,
)
FILTERS = st.recursive(
    st.dictionaries(
        st.sampled_from(["type", "data.status", "data.amount", "metadata.channel", "data"]),
        CONDITIONS,
        min_size=1,
        max_size=3,
    ),
    lambda inner: st.dictionaries(
        st.sampled_from(["$and", "$or"]), st.lists(inner, max_size=3), min_size=1
    ),
    max_leaves=8,
)


@settings(max_examples=400)
@given(spec=FILTERS | JSON, payload=JSON, metadata=st.dictionaries(st.text(max_size=8), JSON))
def test_any_filter_against_any_event_is_an_answer_never_an_exception(spec, payload, metadata):
    problem = filter_problem(spec)
    verdict = filter_verdict(spec, "order.paid", payload, metadata)
    if problem is not None:  # fails closed, and says why
        assert verdict == f"the destination's filter cannot be read: {problem}"
    else:
        assert verdict is None or (isinstance(verdict, str) and verdict)


# --- at admission ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_filtered_event_is_a_message_discarded_by_the_filter_with_its_reason():
    only_paid = destination("only-paid", filter={"data.status": "paid"})
    everything = destination("everything")

    for dest in destinations_for("order.paid"):
        enqueue_webhook(dest, "order.paid", "order:1:paid", body(status="paid"))
        enqueue_webhook(dest, "order.paid", "order:2:paid", body(status="void"))

    kept = OutboxMessage.objects.get(destination=only_paid, key="order:1:paid")
    skipped = OutboxMessage.objects.get(destination=only_paid, key="order:2:paid")
    assert kept.status == MessageStatus.PENDING
    assert (skipped.status, skipped.discarded_by) == (MessageStatus.DISCARDED, "filter")
    assert skipped.discard_reason == "data.status is 'void', not 'paid'"
    assert skipped.discarded_at is not None
    assert OutboxMessage.objects.filter(destination=everything, status="pending").count() == 2


@pytest.mark.django_db
def test_a_filter_that_cannot_be_read_passes_nothing_for_its_destination_alone():
    broken = destination("broken")
    WebhookDestination.objects.filter(pk=broken.pk).update(filter={"data.x": {"$regex": "."}})
    other = destination("other", filter={"data.status": "paid"})

    for dest in destinations_for("order.paid"):
        enqueue_webhook(dest, "order.paid", "order:1:paid", body())

    skipped = OutboxMessage.objects.get(destination__name="broken")
    assert skipped.status == MessageStatus.DISCARDED
    assert skipped.discard_reason.startswith("the destination's filter cannot be read: data.x:")
    assert OutboxMessage.objects.get(destination=other).status == MessageStatus.PENDING


@pytest.mark.django_db
def test_the_command_and_the_form_keep_a_filter_and_refuse_one_that_is_not():
    destination_added("merchant-9", "--filter", '{"data.status": {"$in": ["paid", "fulfilled"]}}')
    assert WebhookDestination.objects.get(name="merchant-9").filter == {
        "data.status": {"$in": ["paid", "fulfilled"]}
    }
    with pytest.raises(CommandError, match=r"--filter: data.x: '\$regex' is not an operator"):
        destination_command("update", "merchant-9", "--filter", '{"data.x": {"$regex": "a"}}')
    with pytest.raises(CommandError, match=r"--filter: not JSON"):
        destination_command("update", "merchant-9", "--filter", "{status: paid}")
    destination_command("update", "merchant-9", "--filter", "")
    assert WebhookDestination.objects.get(name="merchant-9").filter is None

    form = DestinationForm(data={"filter": '{"data.x": {"$in": []}}'})
    form.is_valid()
    assert form.errors["filter"] == ["data.x: $in takes a non-empty list of plain values"]
