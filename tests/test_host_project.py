"""The app inside host projects that differ from the demo: login required everywhere,
every request atomic, handlers that collide."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers as test_handlers
from tests.support.failing import CRASH
from tests.support.http import post
from tests.support.signing import event_body, reserved, standard_headers
from webhook_receiver import handlers
from webhook_receiver.checks import check_webhook_receiver_settings
from webhook_receiver.handlers import webhook_handler
from webhook_receiver.models import FailedEvent, RequestAudit, WebhookReceipt

LOGIN_REQUIRED = "django.contrib.auth.middleware.LoginRequiredMiddleware"


@pytest.fixture
def login_required_everywhere(settings) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, LOGIN_REQUIRED]


@pytest.fixture
def atomic_requests(monkeypatch) -> None:
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)


@pytest.mark.django_db
def test_login_required_middleware_leaves_the_endpoint_to_its_signature(
    client, login_required_everywhere
):
    # given: a host whose every view needs a logged-in user (the admin still does)
    assert client.get("/admin/").status_code == 302
    body = reserved("ord_login", ("SKU-A", 1))

    # when
    applied = post(client, "shop", body, standard_headers(body, msg_id="msg_login"))
    forged = post(client, "shop", body, {**standard_headers(body), "webhook-signature": "v1,AA=="})

    # then: the signature decides, not the login
    assert applied.status_code == 200, applied.content
    assert applied.json()["status"] == "applied"
    assert forged.status_code == 401
    assert InventoryLedgerEntry.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_atomic_requests_keep_a_failed_event_and_its_audit_record(
    client, atomic_requests, crash_handler
):
    # given: every request of the host runs in a transaction, and a handler fails once
    test_handlers.failures_left["count"] = 1
    body = event_body(CRASH, order_id="ord_atomic")

    # when
    failed = post(client, "shop", body, standard_headers(body, msg_id="msg_atomic"))
    good = reserved("ord_atomic_ok", ("SKU-A", 1))
    applied = post(client, "shop", good, standard_headers(good, msg_id="msg_atomic_ok"))

    # then: the failure's rollback took neither its capture nor its audit record along
    assert failed.status_code == 202
    assert failed.json() == {"status": "dead_lettered", "event_key": "msg_atomic"}
    assert FailedEvent.objects.get(event_key="msg_atomic").status == "dead"
    assert not InventoryLedgerEntry.objects.filter(event_key="msg_atomic").exists()
    assert applied.json()["status"] == "applied"
    assert WebhookReceipt.objects.get().event_key == "msg_atomic_ok"
    assert sorted(RequestAudit.objects.values_list("result", flat=True)) == [
        "applied",
        "dead_lettered",
    ]


@contextmanager
def registered(event_type: str, *funcs) -> Iterator[None]:
    """Register ``funcs`` for ``event_type`` in code, and forget them afterwards."""
    try:
        for func in funcs:
            webhook_handler(event_type)(func)
        yield
    finally:
        handlers.unregister(event_type)


def first_refund(event):
    return None


def second_refund(event):
    return None


def conflicts() -> list[str]:
    return [m.msg for m in check_webhook_receiver_settings() if m.id == "webhook_receiver.E005"]


def test_two_handlers_for_one_event_type_fail_the_system_check():
    with registered("refund.created", first_refund, second_refund):
        assert conflicts() == [
            "Event type 'refund.created' has 2 handlers registered in code: "
            "tests.test_host_project.first_refund, tests.test_host_project.second_refund."
        ]
        # the first registration still answers; nothing was silently replaced
        assert handlers.get_handler("refund.created") is first_refund
    assert conflicts() == []


def test_the_same_handler_registered_twice_is_no_conflict():
    with registered("refund.created", first_refund, first_refund):
        assert conflicts() == []


def test_a_handler_chosen_in_settings_settles_a_conflict(settings):
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {"refund.created": "tests.test_host_project.second_refund"},
    }
    with registered("refund.created", first_refund, second_refund):
        assert conflicts() == []
        assert handlers.get_handler("refund.created") is second_refund


def test_the_app_registers_no_handler_of_its_own():
    owners = {func.__module__ for func in handlers.registered().values()}
    assert owners == {"project.shop.handlers"}
    assert not any(m.startswith("webhook_receiver") for m in owners)
