"""The scheme registry: built-ins by name, a host's own scheme by dotted path."""

from __future__ import annotations

import json

import pytest

from project.shop.models import InventoryLedgerEntry
from tests.support.http import post
from webhook_receiver import schemes
from webhook_receiver.checks import check_webhook_receiver_settings
from webhook_receiver.models import WebhookReceipt

ACME_SECRET = "acme-secret-of-some-length"


def acme_source(settings, secret: str = ACME_SECRET) -> None:
    sources = {
        **settings.WEBHOOK_RECEIVER["SOURCES"],
        "acme": {"SCHEME": "tests.support.schemes.Acme", "SECRETS": [secret]},
    }
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}


@pytest.mark.django_db
def test_a_scheme_named_by_dotted_path_verifies_types_and_keys_its_events(client, settings):
    # given
    acme_source(settings)
    payload = {
        "kind": "inventory.reserved",
        "event_id": "acme_1",
        "data": {"order_id": "o1", "version": 2, "lines": [{"sku": "SKU-A", "quantity": 3}]},
    }
    body = json.dumps(payload).encode()
    headers = schemes.sign(
        scheme="tests.support.schemes.Acme",
        secret=ACME_SECRET,
        body=body,
        message_id="",
        timestamp=0,
    )

    # when
    applied = post(client, "acme", body, headers)
    forged = post(client, "acme", body, {"X-Acme-Signature": "0" * 64})

    # then
    assert applied.json() == {"status": "applied", "event_key": "acme_1"}
    assert forged.status_code == 401
    assert WebhookReceipt.objects.get().event_type == "inventory.reserved"
    assert InventoryLedgerEntry.objects.get(order_id="o1").delta == -3


def test_a_schemes_own_secret_rule_is_a_system_check(settings):
    acme_source(settings, secret="short")

    errors = [m for m in check_webhook_receiver_settings() if m.id == "webhook_receiver.E002"]

    assert [m.msg for m in errors] == ["Secret #1 of source 'acme' is shorter than 16 characters."]


@pytest.mark.parametrize(
    "scheme, reason",
    [
        ("stripey", "no scheme 'stripey'; the built-in ones are standard, stripe, github"),
        ("tests.support.schemes.Missing", "'tests.support.schemes.Missing' cannot be imported"),
        ("tests.support.schemes.hashlib", "is not a webhook_receiver.schemes.Scheme subclass"),
    ],
)
def test_an_unknown_scheme_is_a_configuration_error_that_says_why(settings, scheme, reason):
    sources = {"x": {"SCHEME": scheme, "SECRETS": ["whatever-secret"]}}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}

    (error,) = check_webhook_receiver_settings()

    assert error.id == "webhook_receiver.E001"
    assert error.msg.startswith("WEBHOOK_RECEIVER['SOURCES']['x']['SCHEME']: ")
    assert reason in error.msg


def test_every_built_in_scheme_is_registered_under_its_own_name():
    assert {name: scheme.name for name, scheme in schemes.SCHEMES.items()} == {
        "standard": "standard",
        "stripe": "stripe",
        "github": "github",
    }
