"""A GitHub source record keys its events by the signed body (GitHub does not sign its
delivery id), and a handler bound to its sources is out of reach of any other: a
captured, signed GitHub body resent with a new X-GitHub-Delivery is a duplicate, and
resent with X-GitHub-Event: order.paid it moves no order."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from project.shop.models import OrderState
from tests.support.http import post
from tests.support.signing import github_headers
from webhook_receiver.handlers import bound_to, get_handler, handler_sources
from webhook_receiver.models import WebhookReceipt, WebhookSource
from webhook_receiver.sources.operations import source_add

pytestmark = pytest.mark.django_db

SECRET = "a GitHub webhook secret, typed long enough"


@pytest.fixture
def github():
    return source_add(slug="gh", scheme="github", secrets=[SECRET])


def captured_body() -> bytes:
    # what GitHub signed: a body whose fields happen to read as an order's payment
    return json.dumps(
        {"action": "completed", "data": {"order_id": "ord_gh", "version": 9}}
    ).encode()


def resend(client, body: bytes, *, delivery: str, event: str = "push"):
    headers = {**github_headers(body, delivery=delivery, secret=SECRET), "X-GitHub-Event": event}
    return post(client, "gh", body, headers)


def test_a_body_resent_under_a_new_delivery_id_is_a_duplicate(client, github):
    assert github.event_key == ""  # the scheme's choice: for GitHub, the signed body
    body = captured_body()

    first = resend(client, body, delivery="d-1")
    again = resend(client, body, delivery="d-2-made-up")

    assert first.status_code == again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert WebhookReceipt.objects.filter(source="gh").count() == 1


def test_a_github_type_naming_the_shops_payment_reaches_no_handler(client, github):
    body = captured_body()

    paid = resend(client, body, delivery="d-3", event="order.paid")

    # recorded as ignored, saying why; the order was never touched
    assert paid.status_code == 200, paid.content
    assert paid.json()["status"] == "ignored"
    assert paid.json()["detail"] == {"event_type": "order.paid", "handler": "serves other sources"}
    assert not OrderState.objects.filter(order_id="ord_gh").exists()
    # the shop's own source still reaches it
    handler = get_handler("order.paid")
    assert handler is not None and handler_sources(handler) == frozenset({"shop"})
    assert get_handler("order.paid", "shop") is handler
    assert get_handler("order.paid", "gh") is None


def test_bound_to_serves_a_handler_named_in_the_settings(settings):
    @bound_to("billing")
    def refund(event):
        return None

    assert handler_sources(refund) == frozenset({"billing"})


def test_a_record_chooses_its_key_and_only_github_may_key_by_the_body():
    out = io.StringIO()
    call_command(
        "webhook_source", "add", "gh-by-id", "--scheme", "github", "--secret", SECRET,
        "--event-key", "delivery_id", stdout=out, stderr=io.StringIO(),
    )  # fmt: skip
    assert WebhookSource.objects.get(slug="gh-by-id").event_key == "delivery_id"
    with pytest.raises(CommandError, match="the signed body's SHA-256 keys GitHub's events only"):
        call_command(
            "webhook_source", "add", "std", "--secret", "whsec_" + "c2VjcmV0" * 5,
            "--event-key", "signed_body", stdout=io.StringIO(),
        )  # fmt: skip
