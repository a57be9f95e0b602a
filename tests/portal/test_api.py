"""The portal's JSON API (portal/api/): each operation answers its capability and refuses
without it (403), without a session (401), with an ended or revoked one (403); a secret is
answered once (at its making, at a rotation) and never read back; an answer's text only
to a session that may manage endpoints; a cookie needs its CSRF token; a link opens one
session once; over the rate limit, 429 with Retry-After; each action leaves its audit row;
any JSON body is a 201/200 or a 400 with a reason, never a 500."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from datetime import timezone as tz

import pytest
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework import serializers
from rest_framework.test import APIClient

from tests.support.outbox import destination, failed, message
from webhook_receiver.models import (
    DeliveryAttempt,
    OutboxMessage,
    RecoveryJob,
    WebhookDestination,
)
from webhook_receiver.outbound import catalog as event_catalog
from webhook_receiver.outbound import webhook_event
from webhook_receiver.outbound.recovery import Criteria, recovery_start
from webhook_receiver.outbound.tenancy import EVERY_TENANT
from webhook_receiver.portal.access import portal_link, portal_revoke, portal_session_open
from webhook_receiver.portal.guard import COOKIE
from webhook_receiver.portal.models import Capability, PortalAction, PortalSession

pytestmark = pytest.mark.django_db

EVERYTHING = Capability.values
HOOK = "http://127.0.0.1:9/hooks"  # loopback: the suite's egress guard lets it through
ANSWER = '{"error": "no such hook", "trace": "at handler.py:12"}'


def url(name: str, pk: int | None = None) -> str:
    return reverse(f"webhook_portal:{name}", kwargs=None if pk is None else {"pk": pk})


def api(*capabilities: str, tenant: str = "acme") -> APIClient:
    """A client with a bearer session of ``tenant`` holding ``capabilities``."""
    _, key = portal_session_open(tenant, capabilities, by="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def call(client: APIClient, method: str, path: str, body=None):
    if method in ("get", "delete"):
        return getattr(client, method)(path, body or {})
    return getattr(client, method)(path, body if body is not None else {}, format="json")


def with_keys(settings, **keys) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, **keys}


def audit() -> list[str]:
    """The actions done (an action refused is recorded too: refusals())."""
    done = PortalAction.objects.exclude(detail__has_key="refused")
    return list(done.order_by("id").values_list("action", flat=True))


def refusals() -> list[str]:
    refused = PortalAction.objects.filter(detail__has_key="refused")
    return list(refused.order_by("id").values_list("action", flat=True))


@pytest.fixture
def acme() -> dict:
    """Tenant acme: an endpoint with a failed message (its answer's text a trace) and a
    delivered one, a disabled endpoint with a running replay job; tenant bolt beside."""
    shop = destination("acme-shop", tenant="acme", event_types=["order.*"])
    spare = destination("acme-spare", tenant="acme", enabled=False)
    destination("bolt-shop", tenant="bolt")
    now = timezone.now()
    broken = failed(shop, "k-failed", last_attempt_at=now)
    OutboxMessage.objects.filter(pk=broken.pk).update(last_error=ANSWER)
    DeliveryAttempt.objects.filter(message=broken).update(response_excerpt=ANSWER)
    delivered = message(spare, "k-delivered", status="delivered", created_at=now)
    job = recovery_start(
        scope=EVERY_TENANT,
        destination=spare,
        criteria=Criteria("replay", now - timedelta(hours=1)),
        by="ops",
    )
    return {"shop": shop, "spare": spare, "failed": broken, "delivered": delivered, "job": job}


def since() -> str:
    return (timezone.now() - timedelta(hours=2)).isoformat()


# each operation: (route, method, the record its path names, body, capability, status,
# the audit's action); a body or record is a function of the acme fixture
Case = tuple[str, str, Callable | None, Callable | dict | None, str | None, int, str | None]
CASES: list[Case] = [
    ("api_endpoints", "get", None, None, None, 200, None),
    (
        "api_endpoints",
        "post",
        None,
        {"url": HOOK, "event_types": ["order.paid"], "description": "orders"},
        "manage_endpoints",
        201,
        "endpoint.add",
    ),
    ("api_endpoint", "get", lambda a: a["shop"].pk, None, None, 200, None),
    (
        "api_endpoint",
        "patch",
        lambda a: a["shop"].pk,
        {"description": "changed"},
        "manage_endpoints",
        200,
        "endpoint.change",
    ),
    (
        "api_endpoint_disable",
        "post",
        lambda a: a["shop"].pk,
        {},
        "manage_endpoints",
        200,
        "endpoint.disable",
    ),
    (
        "api_endpoint_enable",
        "post",
        lambda a: a["spare"].pk,
        {},
        "manage_endpoints",
        200,
        "endpoint.enable",
    ),
    ("api_endpoint_secret", "get", lambda a: a["shop"].pk, None, "view_secret", 200, None),
    (
        "api_endpoint_secret_rotate",
        "post",
        lambda a: a["shop"].pk,
        {"overlap_seconds": 3600},
        "manage_secret",
        200,
        "secret.rotate",
    ),
    (
        "api_endpoint_test",
        "post",
        lambda a: a["shop"].pk,
        {"event_type": "order.paid"},
        "recover",
        201,
        "endpoint.test",
    ),
    (
        "api_endpoint_recovery_plan",
        "post",
        lambda a: a["shop"].pk,
        lambda a: {"kind": "recover", "since": since()},
        "recover",
        200,
        "recovery.plan",
    ),
    ("api_messages", "get", None, None, None, 200, None),
    ("api_message", "get", lambda a: a["failed"].pk, None, None, 200, None),
    (
        "api_messages_retry",
        "post",
        None,
        lambda a: {"ids": [a["failed"].pk]},
        "recover",
        200,
        "messages.retry",
    ),
    ("api_recovery_jobs", "get", None, None, None, 200, None),
    (
        "api_recovery_jobs",
        "post",
        None,
        lambda a: {"endpoint": a["shop"].pk, "kind": "recover", "since": since()},
        "recover",
        201,
        "recovery.start",
    ),
    ("api_recovery_job", "get", lambda a: a["job"].pk, None, None, 200, None),
    (
        "api_recovery_job_cancel",
        "post",
        lambda a: a["job"].pk,
        {},
        "recover",
        200,
        "recovery.cancel",
    ),
    ("api_catalog", "get", None, None, None, 200, None),
    ("api_session", "delete", None, None, None, 204, "session.sign_out"),
]
CASE_IDS = [f"{method} {name}" for name, method, *_ in CASES]


def request_of(case: Case, acme: dict) -> tuple[str, str, dict | None]:
    name, method, record, body, *_ = case
    path = url(name, record(acme) if record else None)
    return method, path, body(acme) if callable(body) else body


def snapshot() -> list[tuple]:
    return [
        *OutboxMessage.objects.order_by("id").values_list("id", "status", "next_attempt_at"),
        *WebhookDestination.objects.order_by("id").values_list(
            "id", "url", "description", "enabled", "secrets"
        ),
        *RecoveryJob.objects.order_by("id").values_list("id", "state"),
    ]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_each_operation_answers_the_capability_it_needs_and_leaves_its_audit(acme, case):
    *_, capability, status, action = case
    method, path, body = request_of(case, acme)
    client = api(*([capability] if capability else []))

    answer = call(client, method, path, body)

    assert answer.status_code == status, answer.content[:500]
    assert audit() == ([action] if action else [])
    assert answer["Cache-Control"].startswith("max-age=0") and "no-store" in answer["Cache-Control"]
    assert answer["Referrer-Policy"] == "same-origin"
    assert answer["Content-Security-Policy"] == "frame-ancestors 'none'"


@pytest.mark.parametrize("case", [c for c in CASES if c[4]], ids=lambda c: f"{c[1]} {c[0]}")
def test_without_its_capability_an_operation_is_403_and_changes_nothing(acme, case):
    capability = case[4]
    method, path, body = request_of(case, acme)
    client = api(*[c for c in EVERYTHING if c != capability])
    before = snapshot()

    answer = call(client, method, path, body)

    assert answer.status_code == 403
    assert capability and "needs the capability" in answer.json()["detail"]
    assert snapshot() == before and audit() == []


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_without_a_session_an_operation_is_401_and_with_an_ended_one_403(acme, case):
    method, path, body = request_of(case, acme)
    before = snapshot()

    anonymous = call(APIClient(), method, path, body)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"] == 'Bearer realm="webhook portal"'

    expired = api(*EVERYTHING)
    PortalSession.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert call(expired, method, path, body).status_code == 403

    revoked = api(*EVERYTHING)
    portal_revoke(tenant="acme", by="ops")
    ended = call(revoked, method, path, body)
    assert ended.status_code == 403 and "ended" in ended.json()["detail"]

    unknown = APIClient()
    unknown.credentials(HTTP_AUTHORIZATION="Bearer not-a-key")
    assert call(unknown, method, path, body).status_code == 403
    assert audit() == [] and snapshot() == before


# --- the session ------------------------------------------------------------------------


def test_a_link_opens_one_session_once_and_its_key_is_a_bearer():
    token = portal_link("acme", ["recover"], by="ops").url.split("#", 1)[1]
    client = APIClient()

    opened = client.post(url("api_session"), {"token": token}, format="json")

    assert opened.status_code == 201
    body = opened.json()
    assert body["tenant"] == "acme" and body["capabilities"] == ["recover"]
    assert datetime.fromisoformat(body["expires_at"]) > timezone.now()
    again = client.post(url("api_session"), {"token": token}, format="json")
    assert again.status_code == 403 and "used or has expired" in again.json()["detail"]
    for wrong in ({"token": "guessed"}, {"token": ""}):
        assert client.post(url("api_session"), wrong, format="json").status_code == 403
    missing = client.post(url("api_session"), {}, format="json")
    assert missing.status_code == 400 and missing.json()["problems"] == {
        "token": "This field is required."
    }

    client.credentials(HTTP_AUTHORIZATION=f"Bearer {body['session']}")
    assert client.get(url("api_endpoints")).status_code == 200
    assert client.delete(url("api_session")).status_code == 204
    assert client.get(url("api_endpoints")).status_code == 403
    assert PortalSession.objects.get().revoked_by.endswith("(signed out)")


def test_the_exchange_needs_no_csrf_token_and_ignores_an_ended_cookie():
    token = portal_link("acme").url.split("#", 1)[1]
    client = APIClient(enforce_csrf_checks=True)
    client.cookies[COOKIE] = "an-ended-session"

    assert client.post(url("api_session"), {"token": token}, format="json").status_code == 201


def test_with_the_cookie_an_unsafe_request_needs_its_csrf_token(acme):
    _, key = portal_session_open("acme", EVERYTHING, by="test")
    client = APIClient(enforce_csrf_checks=True)
    client.cookies[COOKIE] = key
    path = url("api_endpoint_disable", acme["shop"].pk)

    assert client.get(url("api_endpoints")).status_code == 200
    refused = client.post(path, {}, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert WebhookDestination.objects.get(pk=acme["shop"].pk).enabled and audit() == []

    client.cookies["csrftoken"] = "a" * 32
    allowed = client.post(path, {}, format="json", HTTP_X_CSRFTOKEN="a" * 32)
    assert allowed.status_code == 200 and audit() == ["endpoint.disable"]


# --- endpoints and their secrets ------------------------------------------------------------


def test_an_endpoints_secret_is_answered_when_it_is_made_and_never_read_back(acme):
    client = api(*EVERYTHING)
    made = client.post(
        url("api_endpoints"),
        {"url": HOOK, "event_types": ["order.*"], "filter": {"data.status": "paid"}},
        format="json",
    )
    assert made.status_code == 201, made.content
    body = made.json()
    secret = body["secret"]
    assert secret.startswith("whsec_") and body["warning"] == ""
    assert body["name"].startswith("acme-") and body["filter"] == {"data.status": "paid"}
    stored = WebhookDestination.objects.get(pk=body["id"])
    assert stored.tenant == "acme" and stored.secrets == [secret]

    reads = [
        client.get(url("api_endpoints")),
        client.get(url("api_endpoint", body["id"])),
        client.get(url("api_endpoint_secret", body["id"])),
        client.patch(url("api_endpoint", body["id"]), {"description": "x"}, format="json"),
        client.post(url("api_endpoint_disable", body["id"]), {}, format="json"),
    ]
    for read in reads:
        assert read.status_code == 200
        assert secret not in read.content.decode() and "secrets" not in read.json()
    assert reads[2].json() == {"signing": 1, "public_keys": []}

    rotated = client.post(
        url("api_endpoint_secret_rotate", body["id"]), {"overlap_seconds": 600}, format="json"
    )
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new != secret and new.startswith("whsec_")
    until = datetime.fromisoformat(rotated.json()["old_secrets_sign_until"])
    assert timedelta(minutes=9) < until - timezone.now() <= timedelta(minutes=10)
    assert client.get(url("api_endpoint_secret", body["id"])).json()["signing"] == 2
    shown = client.get(url("api_endpoint", body["id"]))
    assert new not in shown.content.decode() and secret not in shown.content.decode()

    at_once = client.post(
        url("api_endpoint_secret_rotate", body["id"]), {"overlap_seconds": 0}, format="json"
    )
    assert at_once.json()["old_secrets_sign_until"] is None
    assert client.get(url("api_endpoint_secret", body["id"])).json()["signing"] == 1
    too_long = client.post(
        url("api_endpoint_secret_rotate", body["id"]), {"overlap_seconds": 604801}, format="json"
    )
    assert too_long.status_code == 400 and "overlap_seconds" in too_long.json()["problems"]


def test_an_endpoint_is_listed_with_its_health_and_changed_field_by_field(acme):
    client = api("manage_endpoints")
    listed = client.get(url("api_endpoints")).json()
    assert listed["count"] == 2 and listed["next"] is None
    shop = next(e for e in listed["results"] if e["id"] == acme["shop"].pk)
    assert shop["health"]["failed_count"] == 1 and shop["health"]["backlog"] == 0
    assert shop["limits"]["rate_count"] == 10 and shop["url"] == acme["shop"].url
    assert not {"secrets", "retiring_secrets", "tokens", "record_error"} & set(shop)

    changed = client.patch(
        url("api_endpoint", acme["shop"].pk), {"event_types": ["order.paid"]}, format="json"
    )
    assert changed.status_code == 200
    assert changed.json()["event_types"] == ["order.paid"]
    assert changed.json()["url"] == acme["shop"].url and "warning" in changed.json()

    refused = client.patch(
        url("api_endpoint", acme["shop"].pk),
        {"url": "ftp://acme.example/", "event_types": ["nothing.*"]},
        format="json",
    )
    assert refused.status_code == 400
    assert set(refused.json()["problems"]) == {"url", "event_types"}
    assert WebhookDestination.objects.get(pk=acme["shop"].pk).event_types == ["order.paid"]
    missing = client.get(url("api_endpoint", 10**9))
    assert missing.status_code == 404 and missing.json() == {"detail": "not found"}


def test_disabling_and_enabling_say_whether_they_changed_anything(acme):
    client = api("manage_endpoints")
    disable = url("api_endpoint_disable", acme["shop"].pk)
    first, second = client.post(disable), client.post(disable)
    assert (first.json()["changed"], second.json()["changed"]) == (True, False)
    assert first.json()["endpoint"]["enabled"] is False
    enabled = client.post(url("api_endpoint_enable", acme["shop"].pk))
    assert enabled.json()["changed"] is True and enabled.json()["endpoint"]["enabled"]


def test_a_test_event_is_the_catalogs_example_under_a_test_key(acme):
    client = api("recover")
    sent = client.post(
        url("api_endpoint_test", acme["shop"].pk), {"event_type": "order.paid"}, format="json"
    )
    assert sent.status_code == 201
    assert sent.json()["key"].startswith("test:") and sent.json()["created"] is True
    row = OutboxMessage.objects.get(key=sent.json()["key"])
    assert row.payload["data"] == {"order_id": "ord-1042", "status": "paid", "version": 3}

    unknown = client.post(
        url("api_endpoint_test", acme["shop"].pk), {"event_type": "refund.lost"}, format="json"
    )
    assert unknown.status_code == 400 and "refund.lost" in unknown.json()["detail"]


# --- messages -------------------------------------------------------------------------------


def test_an_answers_text_is_shown_only_to_a_session_that_may_manage_endpoints(acme):
    path = url("api_message", acme["failed"].pk)
    hidden = api("recover", "view_secret", "manage_secret").get(path).json()
    shown = api("manage_endpoints").get(path).json()

    size = len(ANSWER.encode())
    assert hidden["last_answer"] is None and hidden["last_answer_bytes"] == size
    [attempt] = hidden["attempts"]
    assert attempt["answer"] is None and attempt["answer_bytes"] == size
    assert "no such hook" not in json.dumps(hidden)
    assert shown["last_answer"] == ANSWER and shown["attempts"][0]["answer"] == ANSWER
    assert shown["payload"] == {"type": "order.paid", "data": {"key": "k-failed"}}
    assert "metadata" not in shown and shown["last_status_code"] == 404

    listed = api().get(url("api_messages"), {"status": "failed"}).json()["results"]
    assert [m["id"] for m in listed] == [acme["failed"].pk] and listed[0]["last_answer"] is None


def test_messages_are_filtered_and_paged_fifty_at_a_time_newest_first(acme):
    shop = acme["shop"]
    older = timezone.now() - timedelta(days=2)
    for n in range(55):
        message(shop, f"k-{n}", event_type="order.cancelled", created_at=older)
    client = api()

    first = client.get(url("api_messages"), {"endpoint": shop.pk}).json()
    assert len(first["results"]) == 50 and first["next"]
    ids = [m["id"] for m in first["results"]]
    assert ids == sorted(ids, reverse=True)
    rest = client.get(first["next"]).json()
    assert len(rest["results"]) == 6 and rest["next"] is None

    def count(**query) -> int:
        found = client.get(url("api_messages"), query)
        assert found.status_code == 200, found.content
        return len(found.json()["results"])

    assert count(event_type="order.cancelled", endpoint=shop.pk) == 50
    recent = (timezone.now() - timedelta(days=1)).isoformat()
    assert count(since=recent) == 2
    assert count(until=recent, endpoint=shop.pk) == 50
    assert count(endpoint=acme["spare"].pk) == 1
    for wrong in ({"since": "yesterday"}, {"status": "lost"}, {"endpoint": "x"}):
        refused = client.get(url("api_messages"), wrong)
        assert refused.status_code == 400 and set(refused.json()["problems"]) == set(wrong)
    bolts = WebhookDestination.objects.get(tenant="bolt").pk
    assert client.get(url("api_messages"), {"endpoint": bolts}).status_code == 404


def test_a_bulk_retry_retries_all_of_the_tenants_or_nothing(acme):
    client = api("recover")
    other = failed(destination("bolt-2", tenant="bolt"), "k-bolt", last_attempt_at=timezone.now())

    mixed = client.post(
        url("api_messages_retry"), {"ids": [acme["failed"].pk, other.pk]}, format="json"
    )
    assert mixed.status_code == 404 and audit() == [] and refusals() == ["messages.retry"]
    assert OutboxMessage.objects.get(pk=acme["failed"].pk).status == "failed"

    retried = client.post(url("api_messages_retry"), {"ids": [acme["failed"].pk]}, format="json")
    assert retried.json() == {"retried": [acme["failed"].pk]}
    assert OutboxMessage.objects.get(pk=acme["failed"].pk).status == "pending"
    empty = client.post(url("api_messages_retry"), {"ids": []}, format="json")
    assert empty.status_code == 400 and "ids" in empty.json()["problems"]


# --- recovery -------------------------------------------------------------------------------


def test_a_plan_writes_nothing_and_a_job_runs_until_cancelled(acme):
    client = api("recover")
    shop = acme["shop"].pk
    criteria = {"kind": "recover", "since": since(), "answer_classes": ["4xx"]}
    before = snapshot()

    plan = client.post(url("api_endpoint_recovery_plan", shop), criteria, format="json")
    assert plan.status_code == 200
    assert plan.json()["count"] == 1 and plan.json()["rate"] == 5.0
    assert plan.json()["sample"][0]["key"] == "k-failed"
    assert plan.json()["duration_seconds"] == pytest.approx(0.2)
    assert snapshot() == before and audit() == ["recovery.plan"]

    started = client.post(url("api_recovery_jobs"), {**criteria, "endpoint": shop}, format="json")
    assert started.status_code == 201
    job = started.json()
    assert (job["endpoint"], job["kind"], job["state"], job["planned"]) == (
        shop,
        "recover",
        "running",
        1,
    )
    assert "created_by" not in job
    twice = client.post(url("api_recovery_jobs"), {**criteria, "endpoint": shop}, format="json")
    assert twice.status_code == 400 and "is running" in twice.json()["detail"]

    listed = client.get(url("api_recovery_jobs"), {"endpoint": shop}).json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert len(client.get(url("api_recovery_jobs")).json()) == 2
    read = client.get(url("api_recovery_job", job["id"])).json()
    assert read["progress"] == 0.0 and read["sent"] == {}

    cancelled = client.post(url("api_recovery_job_cancel", job["id"]))
    again = client.post(url("api_recovery_job_cancel", job["id"]))
    assert cancelled.json()["changed"] is True and again.json()["changed"] is False
    assert cancelled.json()["job"]["state"] == "cancelled"
    assert audit() == ["recovery.plan", "recovery.start", "recovery.cancel", "recovery.cancel"]
    assert refusals() == ["recovery.start"]  # the second, while the first ran


def test_a_plan_past_the_replay_horizon_is_refused_with_its_reason(acme):
    old = (timezone.now() - timedelta(days=31)).isoformat()
    refused = api("recover").post(
        url("api_endpoint_recovery_plan", acme["shop"].pk),
        {"kind": "recover", "since": old},
        format="json",
    )
    assert refused.status_code == 400 and "replay horizon" in refused.json()["detail"]


# --- the catalog, the rate limit ------------------------------------------------------------


class Refund(serializers.Serializer):
    """A refund was issued."""

    refund_id = serializers.CharField()


def test_the_catalog_lists_each_type_and_points_at_its_schema():
    webhook_event("refund.issued", serializer=Refund, opt_in=True, example={"refund_id": "r1"})
    try:
        answer = api().get(url("api_catalog")).json()
    finally:
        event_catalog.undeclare("refund.issued")

    document = "http://testserver/webhooks-catalog/openapi.json"
    assert answer["document"] == document
    types = {t["name"]: t for t in answer["event_types"]}
    assert types["refund.issued"] == {
        "name": "refund.issued",
        "group": "refund",
        "version": 1,
        "description": "A refund was issued.",
        "deprecated": False,
        "opt_in": True,
        "example": {"refund_id": "r1"},
        "schema": f"{document}#/webhooks/refund.issued",
    }
    assert types["order.paid"]["example"]["status"] == "paid"


def test_over_the_actions_a_minute_an_action_is_429_with_retry_after(settings, acme):
    with_keys(settings, PORTAL_ACTIONS_PER_MINUTE=2)
    client = api("manage_endpoints")
    disable = url("api_endpoint_disable", acme["shop"].pk)
    enable = url("api_endpoint_enable", acme["shop"].pk)

    assert client.post(disable).status_code == 200
    assert client.post(enable).status_code == 200
    busy = client.post(disable)

    assert busy.status_code == 429
    assert 1 <= int(busy["Retry-After"]) <= 61 and "Too many" in busy.json()["detail"]
    assert WebhookDestination.objects.get(pk=acme["shop"].pk).enabled
    assert audit() == ["endpoint.disable", "endpoint.enable"]
    assert client.get(url("api_endpoints")).status_code == 200  # reading is no action


@pytest.mark.parametrize(
    "raw, field",
    [
        (f'{{"url": "{HOOK}", "description": "a\\u0000b"}}', "description"),
        (f'{{"url": "{HOOK}", "description": "a\\ud800b"}}', "description"),
        (f'{{"url": "{HOOK}", "filter": {{"data.x": "a\\u0000"}}}}', "filter"),
        (f'{{"url": "{HOOK}", "filter": {{"\\udfff": "a"}}}}', "filter"),
        (f'{{"url": "{HOOK}", "filter": {{"data.x": 1e400}}}}', "filter"),
        (f'{{"url": "{HOOK}", "event_types": ["order.\\ud800"]}}', "event_types.0"),
    ],
)
def test_what_postgresql_cannot_store_is_refused_before_it_is_tried(raw, field):
    client = api("manage_endpoints")
    refused = client.post(url("api_endpoints"), raw, content_type="application/json")
    assert refused.status_code == 400 and list(refused.json()["problems"]) == [field]
    assert not WebhookDestination.objects.exists() and audit() == []


def test_a_refusal_that_quotes_what_is_not_text_is_still_answered(acme):
    raw = '{"kind": "\\ud800", "since": "now", "answer_classes": ["\\udfff"]}'
    path = url("api_endpoint_recovery_plan", acme["shop"].pk)
    refused = api("recover").post(path, raw, content_type="application/json")
    assert refused.status_code == 400
    assert refused.json()["problems"]["kind"] == '"\ufffd" is not a valid choice.'
    assert set(refused.json()["problems"]) == {"kind", "since", "answer_classes.0"}


# --- any body ---------------------------------------------------------------------------------

# text that PostgreSQL cannot store (NUL, lone surrogates) as well as ordinary text
TEXT = st.text(max_size=20) | st.text(st.characters(categories=["Cs", "Cc", "Lu"]), max_size=4)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=10,
)
URLS = st.sampled_from(
    [HOOK, "https://acme.example/in", "ftp://acme.example/", "http://10.0.0.1/", "", "http:/x",
     "http://user:pw@127.0.0.1/", "http://[::1", "http://127.0.0.1:99999/"]
)  # fmt: skip
TYPES = st.lists(st.sampled_from(["order.paid", "order.*", "nothing.*", "x"]) | TEXT, max_size=4)
FILTERS = st.sampled_from(
    [{"data.status": "paid"}, {"$or": [{"type": "order.paid"}]}, {"data.x": {"$in": 1}}, {}]
)
ENDPOINT_BODIES = (
    JSON
    | st.fixed_dictionaries(
        {},
        optional={
            "url": URLS | JSON,
            "description": TEXT | JSON,
            "event_types": TYPES | JSON,
            "filter": FILTERS | JSON,
        },
    )
    # near the bodies that are made, so that many are
    | st.fixed_dictionaries(
        {"url": URLS},
        optional={
            "description": TEXT,
            "event_types": st.lists(st.sampled_from(["order.paid", "order.*", "nothing.*"])),
            "filter": FILTERS | st.none(),
        },
    )
)
OFFSETS = st.sampled_from([None, UTC, tz(timedelta(hours=14)), tz(timedelta(hours=-12))])
WHEN = st.datetimes(timezones=OFFSETS).map(datetime.isoformat) | st.sampled_from(
    [(timezone.now() - timedelta(hours=1)).isoformat(), "2024-02-30", "now"]
)
NOW = datetime.now(UTC)
RECENT = st.datetimes(
    min_value=(NOW - timedelta(days=29)).replace(tzinfo=None),
    max_value=(NOW + timedelta(days=1)).replace(tzinfo=None),
    timezones=OFFSETS,
).map(datetime.isoformat)
KINDS = st.sampled_from(["recover", "missing", "replay"])
PLAN_BODIES = (
    JSON
    | st.fixed_dictionaries(
        {},
        optional={
            "kind": KINDS | st.just("undo") | JSON,
            "since": WHEN | JSON,
            "until": WHEN | st.none(),
            "event_types": TYPES | JSON,
            "answer_classes": st.lists(st.sampled_from(["2xx", "4xx", "none", "6xx"])) | JSON,
            "ordering_key_prefix": TEXT | JSON,
            "rate": st.floats() | st.integers() | JSON,
        },
    )
    # near the bodies that are planned, so that many are
    | st.fixed_dictionaries(
        {"kind": KINDS, "since": RECENT},
        optional={
            "until": RECENT | st.none(),
            "event_types": st.lists(st.sampled_from(["order.paid", "order.*", "x.*"])),
            "answer_classes": st.lists(st.sampled_from(["2xx", "4xx", "none"])),
            "ordering_key_prefix": TEXT,
            "rate": st.floats(min_value=0, max_value=20) | st.none(),
        },
    )
)
RAW = st.sampled_from([b"", b"{", b"[1,", b"NaN", b'{"url": Infinity}', b"[" * 100_000])
FUZZ = hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def refused_or(answer, status: int) -> dict:
    assert answer.status_code in (status, 400), answer.content[:500]
    event(f"answered {answer.status_code}")
    body = answer.json()
    if answer.status_code == 400:
        assert isinstance(body["detail"], str) and body["detail"]
        assert isinstance(body["problems"], dict)
    return body


@pytest.fixture
def unlimited(settings):
    with_keys(settings, PORTAL_ACTIONS_PER_MINUTE=1_000_000)


@FUZZ
@given(body=ENDPOINT_BODIES | RAW)
def test_any_body_of_a_new_endpoint_is_made_or_refused_with_a_reason(unlimited, body):
    client = api("manage_endpoints")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    made = refused_or(client.post(url("api_endpoints"), raw, content_type="application/json"), 201)
    if "secret" in made:
        assert WebhookDestination.objects.get(pk=made["id"]).secrets == [made["secret"]]


@FUZZ
@given(body=PLAN_BODIES | RAW)
def test_any_body_of_a_recovery_plan_is_planned_or_refused_with_a_reason(acme, body):
    client = api("recover")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    path = url("api_endpoint_recovery_plan", acme["shop"].pk)
    plan = refused_or(client.post(path, raw, content_type="application/json"), 200)
    assert plan.get("count", 0) >= 0
