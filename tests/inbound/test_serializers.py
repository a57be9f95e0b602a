"""Handlers that declare a DRF serializer (``webhook_handler(..., serializer=...)``): they
receive the validated data; data the serializer refuses is a dead letter whose error
lists every field in DRF's words, on the failed-event page and in webhook_trace."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework import serializers

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.settings import WEBHOOK_RECEIVER
from tests.support.http import post
from tests.support.signing import standard_headers
from webhook_receiver.exceptions import InvalidPayload
from webhook_receiver.handlers import HandlerResult, validated_by
from webhook_receiver.models import FailedEvent, WebhookReceipt

pytestmark = pytest.mark.django_db

received: list[dict] = []


class Refund(serializers.Serializer):
    refund_id = serializers.CharField(max_length=20)
    amount = serializers.DecimalField(max_digits=8, decimal_places=2, min_value=0)

    def validate(self, attrs):
        if attrs["refund_id"].startswith("x"):
            raise serializers.ValidationError("Refunds starting with x are not ours.")
        return attrs


@validated_by(Refund)
def refund_issued(event, data) -> HandlerResult:
    received.append(dict(data))
    if data["amount"] > 1000:
        raise serializers.ValidationError({"amount": ["Too large to refund by webhook."]})
    return HandlerResult(subject=data["refund_id"])


REFUNDS = override_settings(
    WEBHOOK_RECEIVER={
        **WEBHOOK_RECEIVER,
        "HANDLERS": {"refund.issued": "tests.inbound.test_serializers.refund_issued"},
    }
)


def send(client, key: str, event_type: str, data) -> dict:
    body = json.dumps({"type": event_type, "data": data}).encode()
    answer = post(client, "shop", body, standard_headers(body, msg_id=key))
    assert answer.status_code in (200, 202), answer.content
    return answer.json()


def last_error(key: str) -> dict:
    return FailedEvent.objects.get(event_key=key).errors[-1]


@REFUNDS
def test_the_handler_receives_the_data_as_its_serializer_validated_it(client):
    received.clear()
    answer = send(client, "msg_refund", "refund.issued", {"refund_id": "r_1", "amount": "12.50"})

    assert answer["status"] == "applied"
    [data] = received
    assert str(data["amount"]) == "12.50" and type(data["amount"]).__name__ == "Decimal"
    assert WebhookReceipt.objects.get(event_key="msg_refund").subject == "r_1"


@REFUNDS
@pytest.mark.parametrize(
    ("data", "fields"),
    [
        (
            {"amount": "-1"},
            {
                "refund_id": ["This field is required."],
                "amount": ["Ensure this value is greater than or equal to 0."],
            },
        ),
        ({"refund_id": "x_9", "amount": "1"}, {"data": ["Refunds starting with x are not ours."]}),
        (["not", "an", "object"], {"data": ["Invalid data. Expected a dictionary, but got list."]}),
        # raised by the handler itself, after the serializer let the data through
        ({"refund_id": "r_2", "amount": "5000"}, {"amount": ["Too large to refund by webhook."]}),
    ],
)
def test_data_the_serializer_refuses_is_a_dead_letter_listing_each_field(client, data, fields):
    # when
    answer = send(client, "msg_bad_refund", "refund.issued", data)

    # then: dead at once (a permanent error), with DRF's words per field
    assert answer["status"] == "dead_lettered"
    failed = FailedEvent.objects.get(event_key="msg_bad_refund")
    assert failed.status == "dead" and failed.attempts == 1
    entry = last_error("msg_bad_refund")
    assert entry["kind"] == "permanent"
    assert entry["exception"] == "webhook_receiver.exceptions.InvalidPayload"
    assert entry["fields"] == fields
    for path, words in fields.items():
        assert f"{path}: {words[0]}" in failed.last_error_message
    assert not WebhookReceipt.objects.filter(event_key="msg_bad_refund").exists()


def test_the_shops_handlers_validate_with_serializers(client):
    # given: a reservation whose second line is wrong twice, and an order move without
    # its version
    lines = [{"sku": "SKU-1", "quantity": 1}, {"sku": 7, "quantity": 0}]
    reservation = {"order_id": "ord_s", "version": 1, "lines": lines}

    # when
    reserved = send(client, "msg_bad_lines", "inventory.reserved", reservation)
    paid = send(client, "msg_bad_move", "order.paid", {"order_id": "ord_s", "version": "2"})
    fine = send(client, "msg_good_move", "order.paid", {"order_id": "ord_s", "version": 2})

    # then: each names its fields, nothing of theirs was applied, the good one was
    assert (reserved["status"], paid["status"], fine["status"]) == (
        "dead_lettered",
        "dead_lettered",
        "applied",
    )
    assert last_error("msg_bad_lines")["fields"] == {
        "lines[1].sku": ["Not a valid string."],
        "lines[1].quantity": ["Ensure this value is greater than or equal to 1."],
    }
    assert last_error("msg_bad_move")["fields"] == {"version": ["A valid integer is required."]}
    assert InventoryLedgerEntry.objects.count() == 0
    assert OrderState.objects.get(order_id="ord_s").version == 2


def test_webhook_trace_and_the_failed_event_page_show_one_field_a_line(client, admin_client):
    # given
    lines = [{"sku": "SKU-1", "quantity": 0}]
    send(client, "msg_trace_fields", "inventory.reserved", {"order_id": "", "lines": lines})
    failed = FailedEvent.objects.get(event_key="msg_trace_fields")

    # when
    out = io.StringIO()
    call_command("webhook_trace", "msg_trace_fields", "--source", "shop", stdout=out)
    page = admin_client.get(f"/admin/webhook_receiver/failedevent/{failed.pk}/change/")

    # then: each field on a line of its own under the attempt, and in a list on the page
    text = out.getvalue()
    for line in (
        "order_id: This field may not be blank.",
        "version: This field is required.",
        "lines[0].quantity: Ensure this value is greater than or equal to 1.",
    ):
        assert any(row.strip() == line for row in text.splitlines()), text
        path, words = line.split(": ", 1)
        assert f"<li><code>{path}</code>: {words}</li>" in page.content.decode()


def test_nested_errors_are_flattened_to_paths():
    errors = {
        "lines": {1: {"quantity": ["Too small."]}, 3: {"non_field_errors": ["No."]}},
        "non_field_errors": ["Inconsistent."],
        "tags": [["Bad tag."], []],
    }
    found = InvalidPayload.from_serializer_errors(errors)
    assert found.fields == {
        "lines[1].quantity": ["Too small."],
        "lines[3]": ["No."],
        "data": ["Inconsistent."],
        "tags[0]": ["Bad tag."],
    }
    assert str(found) == (
        "data is not valid: lines[1].quantity: Too small.; lines[3]: No.; data: Inconsistent.;"
        " tags[0]: Bad tag."
    )
