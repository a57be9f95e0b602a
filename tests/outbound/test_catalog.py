"""The event catalog: declaring event types (``@webhook_event``), checking admissions
against it (``CATALOG_CHECK``), its system checks, and its OpenAPI 3.1 document (the
view, the command, the shape Svix and Convoy import)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from prometheus_client import REGISTRY
from rest_framework import serializers

from tests.support.outbox import destination, destination_added, destination_command
from webhook_receiver.admin.forms import DestinationForm
from webhook_receiver.checks import check_event_catalog
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import (
    EventRefused,
    destinations_for,
    enqueue_webhook,
    webhook_event,
)
from webhook_receiver.outbound import catalog as event_catalog
from webhook_receiver.outbound.catalog_document import catalog_document

SHOP_TYPES = ["order.cancelled", "order.fulfilled", "order.paid"]
NOTICE_TYPES = [
    "outbox.destination_disabled",
    "outbox.destination_failing",
    "outbox.message_failed",
    "silence.alert_opened",
    "silence.alert_resolved",
]


class RefundIssued(serializers.Serializer):
    """A refund was issued for an order."""

    refund_id = serializers.CharField()
    amount = serializers.IntegerField(min_value=1, help_text="In the currency's minor unit.")
    currency = serializers.CharField(min_length=3, max_length=3)


class Elsewhere(serializers.Serializer):
    other = serializers.CharField()


REFUND = {"refund_id": "re_1", "amount": 1250, "currency": "EUR"}


@contextmanager
def declared(*names: str) -> Iterator[None]:
    """Forget the event types ``names`` once the block ends (the test declares them)."""
    try:
        yield
    finally:
        for name in names:
            event_catalog.undeclare(name)


def uncatalogued(reason: str) -> float:
    labels = {"destination": "merchant-1", "reason": reason}
    return REGISTRY.get_sample_value("webhook_receiver_outbox_uncatalogued_total", labels) or 0.0


def refund_body(data=None, **envelope):
    return {"type": "refund.issued", "data": REFUND if data is None else data, **envelope}


def messages_with(event_type: str) -> int:
    return OutboxMessage.objects.filter(event_type=event_type).count()


# --- declaring -----------------------------------------------------------------------


def test_a_serializer_declares_its_event_type_and_keeps_its_docstring_as_description():
    with declared("refund.issued"):
        webhook_event("refund.issued", example=REFUND, version=2)(RefundIssued)

        entry = event_catalog.event_type("refund.issued")
        assert entry is not None
        assert entry.serializer is RefundIssued
        assert (entry.group, entry.version, entry.description) == (
            "refund",
            2,
            "A refund was issued for an order.",
        )
        assert not entry.deprecated and not entry.opt_in
        assert event_catalog.example_problem(entry) is None


def test_a_serializer_declared_elsewhere_is_named_with_serializer_and_shared_by_types():
    with declared("refund.issued", "refund.reversed"):
        issued = webhook_event("refund.issued", serializer=RefundIssued, example=REFUND)
        reversed_ = webhook_event(
            "refund.reversed", serializer=RefundIssued, deprecated=True, opt_in=True
        )

        assert issued.serializer is reversed_.serializer is RefundIssued
        assert reversed_.deprecated and reversed_.opt_in
        assert [e.name for e in event_catalog.catalog() if e.group == "refund"] == [
            "refund.issued",
            "refund.reversed",
        ]


@pytest.mark.parametrize(
    "name", ["Order.Paid", "order paid", "order.", ".paid", "order.*", "order..paid", ""]
)
def test_a_name_that_is_not_dot_separated_lower_case_words_is_refused_at_once(name):
    with pytest.raises(ValueError, match="dot-separated"):
        webhook_event(name, serializer=RefundIssued)
    assert event_catalog.event_type(name) is None


def test_a_second_different_declaration_is_a_start_up_error_and_the_first_one_stays():
    with declared("refund.issued"):
        webhook_event("refund.issued", serializer=RefundIssued)
        webhook_event("refund.issued", serializer=RefundIssued)  # the same again: no conflict
        assert not [m for m in check_event_catalog() if m.id == "webhook_receiver.E012"]

        webhook_event("refund.issued", serializer=Elsewhere)

        [error] = [m for m in check_event_catalog() if m.id == "webhook_receiver.E012"]
        assert error.msg == (
            "Event type 'refund.issued' is declared 2 times, differently: "
            "tests.outbound.test_catalog.RefundIssued, tests.outbound.test_catalog.Elsewhere."
        )
        assert event_catalog.event_type("refund.issued").serializer is RefundIssued


def test_an_example_the_serializer_refuses_is_a_start_up_error():
    with declared("refund.issued"):
        webhook_event("refund.issued", serializer=RefundIssued, example={"amount": 0})

        [error] = [m for m in check_event_catalog() if m.id == "webhook_receiver.E013"]
        assert "refund_id: This field is required." in error.msg
        assert "amount: Ensure this value is greater than or equal to 1." in error.msg


def test_the_app_and_the_demo_shop_declare_what_they_send_with_examples_that_validate():
    names = [e.name for e in event_catalog.catalog()]
    assert set(SHOP_TYPES + NOTICE_TYPES) <= set(names)
    for name in NOTICE_TYPES:
        assert event_catalog.event_type(name).opt_in  # no merchant's wildcard reaches them
    assert not [m for m in check_event_catalog() if m.level >= logging.WARNING]


# --- at admission ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("event_type", "payload", "problem"),
    [
        ("refund.lost", {"type": "refund.lost", "data": {}}, "'refund.lost' is not in the event"),
        ("refund.issued", refund_body(type="refund.other"), "the body's type is 'refund.other'"),
        ("refund.issued", {"type": "refund.issued"}, "the body has no data"),
        ("refund.issued", refund_body({**REFUND, "currency": "E"}), "currency: Ensure"),
        ("refund.issued", refund_body(["not", "an", "object"]), "Invalid data. Expected a"),
    ],
)
def test_refuse_raises_before_anything_is_written(settings, event_type, payload, problem):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": "refuse"}
    dest = destination("merchant-1")
    with declared("refund.issued"):
        webhook_event("refund.issued", serializer=RefundIssued)
        with pytest.raises(EventRefused, match=problem), transaction.atomic():
            enqueue_webhook(dest, event_type, "refund:re_1", payload)
        admitted = enqueue_webhook(dest, "refund.issued", "refund:re_2", refund_body())

    assert messages_with(event_type) == (1 if event_type == "refund.issued" else 0)
    assert admitted.created


@pytest.mark.django_db
def test_record_admits_as_given_counts_each_and_logs_the_first_of_a_type(settings, caplog):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": "record"}
    dest = destination("merchant-1")
    undeclared = uncatalogued(reason="undeclared")
    invalid = uncatalogued(reason="invalid")
    caplog.set_level(logging.WARNING, logger="webhook_receiver.outbound.catalog")
    with declared("refund.issued", "refund.lost"):
        webhook_event("refund.issued", serializer=RefundIssued)
        for n in range(3):
            enqueue_webhook(dest, "refund.lost", f"lost:{n}", {"type": "refund.lost"})
        enqueue_webhook(dest, "refund.issued", "refund:bad", refund_body({"amount": "x"}))
        enqueue_webhook(dest, "refund.issued", "refund:good", refund_body())

    assert messages_with("refund.lost") == 3 and messages_with("refund.issued") == 2
    assert uncatalogued(reason="undeclared") == (undeclared + 3)
    assert uncatalogued(reason="invalid") == invalid + 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "outbox: a message outside the event catalog admitted as given: 'refund.lost' is not "
        "in the event catalog (later ones of this type are counted, not logged: "
        "webhook_receiver_outbox_uncatalogued_total)",
        "outbox: a message outside the event catalog admitted as given: refund.issued: data "
        "does not match RefundIssued: refund_id: This field is required.; amount: A valid "
        "integer is required.; currency: This field is required. (later ones of this type "
        "are counted, not logged: webhook_receiver_outbox_uncatalogued_total)",
    ]


@pytest.mark.django_db
def test_off_checks_nothing(settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": "off"}
    before = uncatalogued(reason="undeclared")

    enqueue_webhook(destination("merchant-1"), "refund.lost", "lost:1", {"anything": 1})

    assert messages_with("refund.lost") == 1
    assert uncatalogued(reason="undeclared") == before


def test_the_default_refuses_with_debug_and_records_without(settings):
    settings.WEBHOOK_RECEIVER = {
        k: v for k, v in settings.WEBHOOK_RECEIVER.items() if k != "CATALOG_CHECK"
    }
    settings.DEBUG = True
    assert event_catalog.catalog_check() == "refuse"
    settings.DEBUG = False
    assert event_catalog.catalog_check() == "record"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    event_type=st.sampled_from(["order.paid", "refund.lost", ""]) | st.text(max_size=12),
    body=JSON | st.fixed_dictionaries({"type": st.just("order.paid"), "data": JSON}),
)
def test_any_body_gets_a_reason_or_none_never_an_exception(event_type, body):
    problem = event_catalog.admission_problem(event_type, body)
    assert problem is None or (isinstance(problem, str) and problem)


# --- the document ----------------------------------------------------------------------


def _resolve(document: dict, ref: str) -> dict:
    node: dict = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def test_the_document_is_openapi_3_1_with_one_webhook_per_declared_type():
    with declared("refund.issued", "refund.reversed"):
        webhook_event("refund.issued", serializer=RefundIssued, example=REFUND)
        webhook_event("refund.reversed", serializer=RefundIssued, deprecated=True)

        document = catalog_document()
        names = [e.name for e in event_catalog.catalog()]

    validate(document)  # the OpenAPI 3.1 schema: raises when it does not hold
    assert document["openapi"] == "3.1.0"
    assert document["info"] == {"title": "Webhooks", "version": "1"}
    assert list(document["webhooks"]) == names
    assert {"refund.issued", "refund.reversed", *SHOP_TYPES} <= set(names)

    # the shape Svix's and Convoy's OpenAPI import reads: the webhooks map, one operation
    # (post) per type, its request body's JSON schema, an example
    issued = document["webhooks"]["refund.issued"]
    assert list(issued) == ["post"]
    operation = issued["post"]
    content = operation["requestBody"]["content"]["application/json"]
    envelope = _resolve(document, content["schema"]["$ref"])
    assert envelope["required"] == ["data", "type"]
    assert envelope["properties"]["type"]["const"] == "refund.issued"
    data = _resolve(document, envelope["properties"]["data"]["$ref"])
    assert sorted(data["required"]) == ["amount", "currency", "refund_id"]
    assert data["properties"]["amount"] == {
        "type": "integer",
        "minimum": 1,
        "description": "In the currency's minor unit.",
    }
    [example] = content["examples"].values()
    assert example["value"] == {"type": "refund.issued", "data": REFUND}
    assert operation["description"] == "A refund was issued for an order."
    assert operation["tags"] == ["refund"]
    assert operation["x-event-version"] == 1 and operation["x-opt-in"] is False
    assert "deprecated" not in operation
    assert document["webhooks"]["refund.reversed"]["post"]["deprecated"] is True


def test_without_drf_spectaculars_schema_class_the_document_is_a_warning_and_a_503(
    settings, client
):
    settings.REST_FRAMEWORK = {}
    [warning] = [m for m in check_event_catalog() if m.id == "webhook_receiver.W007"]
    assert 'REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "drf_spectacular.openapi.AutoSchema"' in (
        warning.msg
    )
    with declared("refund.issued"):
        webhook_event("refund.issued", serializer=RefundIssued)  # a new revision
        answer = client.get("/webhooks-catalog/openapi.json")
    assert answer.status_code == 503
    assert b"cannot be made here" in answer.content


def test_the_view_serves_the_document_and_a_new_declaration_reaches_it(client):
    first = client.get("/webhooks-catalog/openapi.json")
    assert first.status_code == 200
    assert first["Content-Type"] == "application/json"
    assert first["Cache-Control"] == "public, max-age=300"
    assert json.loads(first.content) == catalog_document()
    with declared("refund.issued"):
        webhook_event("refund.issued", serializer=RefundIssued)
        assert (
            "refund.issued"
            in json.loads(client.get("/webhooks-catalog/openapi.json").content)["webhooks"]
        )
    assert client.post("/webhooks-catalog/openapi.json").status_code == 405


def test_the_command_prints_the_document_and_lists_the_types():
    out = StringIO()
    call_command("webhook_catalog", stdout=out)
    assert json.loads(out.getvalue()) == catalog_document()

    listed = StringIO()
    call_command("webhook_catalog", "--list", stdout=listed)
    lines = listed.getvalue().splitlines()
    assert lines[0].split() == ["order.cancelled", "v1", "project.shop.events.OrderChanged"]
    [failed] = [line for line in lines if line.startswith("outbox.message_failed ")]
    assert failed.split() == [
        "outbox.message_failed",
        "v1",
        "opt-in",
        "webhook_receiver.outbound.notices.MessageFailed",
    ]


# --- subscriptions ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_group_pattern_reaches_its_declared_types_but_never_an_opt_in_or_undeclared_one():
    exact = destination("exact")
    exact.event_types = ["refund.issued"]
    exact.save()
    group = destination("group")
    group.event_types = ["refund.*"]
    group.save()
    with declared("refund.issued", "refund.chargeback.opened", "refund.disputed", "refunds.x"):
        webhook_event("refund.issued", serializer=RefundIssued)
        webhook_event("refund.chargeback.opened", serializer=RefundIssued)
        webhook_event("refund.disputed", serializer=RefundIssued, opt_in=True)
        webhook_event("refunds.x", serializer=RefundIssued)

        def reached(event_type: str) -> list[str]:
            return [d.name for d in destinations_for(event_type)]

        assert reached("refund.issued") == ["exact", "group"]
        assert reached("refund.chargeback.opened") == ["group"]  # a deeper type is in it
        assert reached("refund.disputed") == []  # opt-in: by its name only
        assert reached("refund.undeclared") == []  # a wildcard never reaches the unknown
        assert reached("refunds.x") == []  # "refund." is the group, not "refund"
        assert group.subscribes_to("refund.issued") and not group.subscribes_to("refunds.x")


@pytest.mark.parametrize(
    ("subscription", "check", "problem"),
    [
        ("order.*", "record", None),
        ("order.paid", "refuse", None),
        ("refund.issued", "record", None),  # not declared: allowed unless refusing
        ("refund.issued", "refuse", "'refund.issued' is not in the event catalog"),
        ("refund.*", "record", "refund.* matches no declared event type"),
        ("outbox.*", "record", "outbox.* matches no declared event type"),  # all opt-in
        ("order*", "record", "'order*': a pattern is a group followed by .*"),
        ("*", "record", "'*': a pattern is a group followed by .*"),
        ("Order.Paid", "record", "'Order.Paid' is not an event type"),
    ],
)
def test_what_a_destination_may_subscribe_to(settings, subscription, check, problem):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "CATALOG_CHECK": check}
    found = event_catalog.subscription_problem(subscription)
    assert found == problem if problem is None else problem in found


@pytest.mark.django_db
def test_the_command_and_the_admin_form_refuse_a_pattern_that_reaches_nothing():
    destination_added("merchant-9", "--events", "order.*,outbox.message_failed")
    assert WebhookDestination.objects.get(name="merchant-9").event_types == [
        "order.*",
        "outbox.message_failed",
    ]
    with pytest.raises(CommandError, match=r"--events: refund\.\* matches no declared event"):
        destination_command("update", "merchant-9", "--events", "refund.*")

    form = DestinationForm(data={"event_types": "order.*\nrefund.*\nbad*"})
    form.is_valid()
    assert form.errors["event_types"] == [
        "refund.* matches no declared event type (an opt-in type is subscribed to by its name)",
        "'bad*': a pattern is a group followed by .* (order.*)",
    ]
