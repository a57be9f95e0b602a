"""Nothing crosses tenants: every portal URL and API endpoint (each method it answers),
opened with tenant bolt's session holding every capability, against tenant acme's ids
(in the path, the query or the body, bulk actions included), answers 404 and changes
nothing. A URL added to the portal fails here until it has its case."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from tests.support.outbox import destination, failed, message
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, RecoveryJob, WebhookDestination
from webhook_receiver.outbound.recovery import Criteria, recovery_start
from webhook_receiver.outbound.tenancy import EVERY_TENANT
from webhook_receiver.portal.access import portal_session_open
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import Capability, PortalAction

pytestmark = pytest.mark.django_db

EVERYTHING = Capability.values
SINCE = (timezone.now() - timedelta(days=1)).isoformat()


@pytest.fixture
def acme():
    """Tenant acme's endpoint with a failed and a delivered message and a running job."""
    dest = destination("acme-shop", tenant="acme", event_types=["order.*"])
    found = {
        "endpoint": dest,
        "failed": failed(dest, "k-failed", last_attempt_at=timezone.now()),
        "delivered": message(dest, "k-delivered", status="delivered"),
    }
    found["job"] = recovery_start(
        scope=EVERY_TENANT,
        destination=dest,
        criteria=Criteria("replay", timezone.now() - timedelta(hours=1)),
        by="ops",
    )
    return found


@pytest.fixture
def bolt():
    """Tenant bolt's session, with every capability, in a browser-like client (its pages'
    forms post a CSRF token: this client is not checked, the pages' own tests are)."""
    destination("bolt-shop", tenant="bolt")
    _, key = portal_session_open("bolt", EVERYTHING, by="test")
    client = Client()
    client.cookies[COOKIE] = key
    return client


def snapshot() -> list[tuple]:
    return [
        *OutboxMessage.objects.order_by("id").values_list("id", "status", "next_attempt_at"),
        *WebhookDestination.objects.order_by("id").values_list("id", "url", "enabled", "secrets"),
        *RecoveryJob.objects.order_by("id").values_list("id", "state"),
        (DeliveryAttempt.objects.count(),),
    ]


def endpoint(a):
    return {"pk": a["endpoint"].pk}


def msg(a):
    return {"pk": a["failed"].pk}


def job(a):
    return {"pk": a["job"].pk}


ENDPOINT_FORM = {"url": "https://changed.example/in", "event_types": ["order.paid"]}
PLAN = {"kind": "recover", "since": SINCE, "plan": "1"}
# route name -> the requests that name acme's records: (method, path kwargs, query or body)
PAGES = {
    "endpoint": [("get", endpoint, {})],
    "endpoint_edit": [("get", endpoint, {}), ("post", endpoint, ENDPOINT_FORM)],
    "endpoint_disable": [("post", endpoint, {})],
    "endpoint_enable": [("post", endpoint, {})],
    "endpoint_secret": [("get", endpoint, {}), ("post", endpoint, {"overlap": "3600"})],
    "endpoint_test": [("get", endpoint, {}), ("post", endpoint, {"event_type": "order.paid"})],
    "endpoint_recover": [
        ("get", endpoint, {}),
        ("post", endpoint, PLAN),
        ("post", endpoint, {**PLAN, "plan": "", "start": "1"}),
    ],
    "messages": [("get", None, lambda a: {"endpoint": a["endpoint"].pk})],
    "messages_retry": [("post", None, lambda a: {"ids": [a["failed"].pk]})],
    "message": [("get", msg, {})],
    "recovery_job": [("get", job, {})],
    "recovery_cancel": [("post", job, {})],
}
# routes that name no record of a tenant: what they show is the session's own
NAMELESS = {"enter", "exchange", "sign_out", "endpoints", "endpoint_add", "recovery_jobs",
            "catalog"}  # fmt: skip


def portal_routes() -> set[str]:
    """Every route name of the portal's URLconf, the API's included."""
    names: set[str] = set()

    def visit(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                visit(pattern.url_patterns)
            elif isinstance(pattern, URLPattern) and pattern.name:
                names.add(pattern.name)

    visit(get_resolver("webhook_receiver.portal.urls").url_patterns)
    return names


def requests_of(cases):
    return [(name, *case) for name, made in cases.items() for case in made]


def test_every_portal_route_has_its_cross_tenant_case():
    assert portal_routes() == set(PAGES) | set(API) | NAMELESS


def send(client, method, name, kwargs, data, a, *, as_json=False):
    path = reverse(f"webhook_portal:{name}", kwargs=kwargs(a) if kwargs else None)
    data = data(a) if callable(data) else data
    if method == "get":
        return client.get(path, data)
    if as_json:
        return getattr(client, method)(path, json.dumps(data), content_type="application/json")
    return getattr(client, method)(path, data)


@pytest.mark.parametrize(
    "name, method, kwargs, data", requests_of(PAGES), ids=lambda v: v if isinstance(v, str) else ""
)
def test_a_page_with_another_tenants_ids_is_not_found_and_changes_nothing(
    acme, bolt, name, method, kwargs, data
):
    before = snapshot()

    answer = send(bolt, method, name, kwargs, data, acme)

    assert answer.status_code == 404, answer.content[:300]
    assert b"acme" not in answer.content
    assert snapshot() == before
    # an action tried is recorded as refused, bolt's own (it counts against its limit)
    recorded = PortalAction.objects.values_list("tenant", "detail__refused")
    assert all(tenant == "bolt" and why for tenant, why in recorded)


API = {
    "api_endpoint": [
        ("get", endpoint, {}),
        ("patch", endpoint, {"url": "https://changed.example/in"}),
    ],
    "api_endpoint_disable": [("post", endpoint, {})],
    "api_endpoint_enable": [("post", endpoint, {})],
    "api_endpoint_secret": [("get", endpoint, {})],
    "api_endpoint_secret_rotate": [("post", endpoint, {"overlap_seconds": 3600})],
    "api_endpoint_test": [("post", endpoint, {"event_type": "order.paid"})],
    "api_endpoint_recovery_plan": [("post", endpoint, {"kind": "recover", "since": SINCE})],
    "api_messages": [("get", None, lambda a: {"endpoint": a["endpoint"].pk})],
    "api_messages_retry": [("post", None, lambda a: {"ids": [a["failed"].pk]})],
    "api_message": [("get", msg, {})],
    "api_recovery_jobs": [
        ("get", None, lambda a: {"endpoint": a["endpoint"].pk}),
        ("post", None, lambda a: {"endpoint": a["endpoint"].pk, "kind": "replay", "since": SINCE}),
    ],
    "api_recovery_job": [("get", job, {})],
    "api_recovery_job_cancel": [("post", job, {})],
}
API_NAMELESS = {"api_session", "api_endpoints", "api_catalog"}
NAMELESS |= API_NAMELESS


@pytest.mark.parametrize(
    "name, method, kwargs, data", requests_of(API), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_api_call_with_another_tenants_ids_is_not_found_and_changes_nothing(
    acme, name, method, kwargs, data
):
    destination("bolt-shop", tenant="bolt")
    _, key = portal_session_open("bolt", EVERYTHING, by="test")
    bearer = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    before = snapshot()

    answer = send(bearer, method, name, kwargs, data, acme, as_json=True)

    assert answer.status_code == 404, answer.content[:300]
    assert b"acme" not in answer.content
    assert snapshot() == before
    recorded = PortalAction.objects.values_list("tenant", "detail__refused")
    assert all(tenant == "bolt" and why for tenant, why in recorded)


@pytest.mark.parametrize("name", ["endpoints", "recovery_jobs", "messages", "api_endpoints",
                                  "api_recovery_jobs", "api_messages"])  # fmt: skip
def test_what_a_session_lists_is_its_tenants_alone(acme, bolt, name):
    listed = bolt.get(reverse(f"webhook_portal:{name}")).content.decode()
    assert "acme" not in listed and "k-failed" not in listed
