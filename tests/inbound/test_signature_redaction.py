"""Signature headers are not kept: each scheme's are stored redacted on receipts and
failed events (KEEP_SIGNATURE_HEADERS keeps them), shown redacted whatever a row holds,
and rows stored before are redacted in the database by ``manage.py webhook_redact_headers``.
Retries and replays never verify again, so nothing needs the stored signature.

Deliveries go through the real endpoint, signed by tests/support/signing.py (the standardwebhooks
library, and Stripe's and GitHub's published algorithms).
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.support import handlers
from tests.support.failing import CRASH, fail_crash
from tests.support.http import post
from tests.support.signing import github_headers, reserved, standard_headers, stripe_headers
from webhook_receiver.inbound.failures import failed_event_replay, retry_failed_events
from webhook_receiver.models import FailedEvent, FailureStatus, WebhookReceipt

pytestmark = pytest.mark.django_db

REDACTED = "[redacted]"


def svix_headers(body: bytes, msg_id: str) -> dict[str, str]:
    signed = standard_headers(body, msg_id=msg_id)
    return {f"svix-{name.removeprefix('webhook-')}": value for name, value in signed.items()}


def stripe_body(event_id: str) -> bytes:
    return json.dumps({"id": event_id, "type": "charge.succeeded", "data": {}}).encode()


def github_body() -> bytes:
    return json.dumps({"data": {"order_id": "ord_gh"}}).encode()


# (source, body, headers, the signature header as the sender names it)
SIGNED = {
    "standard": lambda: (
        "shop",
        reserved("ord_s", ("SKU-1", 1)),
        "webhook-signature",
        lambda body: standard_headers(body, msg_id="msg_standard"),
    ),
    "svix": lambda: (
        "shop",
        reserved("ord_v", ("SKU-1", 1)),
        "svix-signature",
        lambda body: svix_headers(body, "msg_svix"),
    ),
    "stripe": lambda: ("stripe", stripe_body("evt_1"), "Stripe-Signature", stripe_headers),
    "github": lambda: ("github", github_body(), "X-Hub-Signature-256", github_headers),
}


def stored_headers(model, pk: int) -> str:
    """The headers column as the database holds it (raw SQL, no ORM decoding)."""
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT headers FROM {table} WHERE id = %s", [pk])
        (value,) = cursor.fetchone()
    return value if isinstance(value, str) else json.dumps(value)


def send(client, source: str, body: bytes, headers: dict[str, str]) -> dict:
    response = post(client, source, body, headers)
    assert response.status_code in (200, 202), response.content
    return response.json()


@pytest.mark.parametrize("scheme", SIGNED)
def test_each_schemes_signature_is_stored_redacted(client, scheme):
    # given
    source, body, header, sign = SIGNED[scheme]()
    headers = sign(body)
    signature = next(v for k, v in headers.items() if k.lower() == header.lower())

    # when
    assert send(client, source, body, headers)["status"] in ("applied", "ignored")

    # then: the header is there, its value is not, in the row as the database holds it
    receipt = WebhookReceipt.objects.get()
    assert {k.lower(): v for k, v in receipt.headers.items()}[header.lower()] == REDACTED
    raw = stored_headers(WebhookReceipt, receipt.pk)
    assert signature not in raw and signature.split(",")[-1] not in raw
    # the rest of what the sender sent is kept
    assert any(k.lower() == "content-type" for k in receipt.headers)


def test_a_failed_events_signature_is_stored_redacted(client, crash_handler):
    failed = fail_crash(client, "msg_crash_redacted")
    assert failed.headers["Webhook-Signature"] == REDACTED
    assert "v1," not in stored_headers(FailedEvent, failed.pk)


def test_keep_signature_headers_keeps_them(client, settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "KEEP_SIGNATURE_HEADERS": True}
    body = reserved("ord_k", ("SKU-1", 1))
    headers = standard_headers(body, msg_id="msg_kept")
    send(client, "shop", body, headers)
    assert WebhookReceipt.objects.get().headers["Webhook-Signature"] == headers["webhook-signature"]


# --- what view-only staff see ------------------------------------------------------------


def test_a_signature_kept_by_an_older_row_is_shown_redacted(client, settings, staff_user):
    # given: a row stored with its signature (before the redaction, or kept by the setting)
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "KEEP_SIGNATURE_HEADERS": True}
    body = github_body()
    headers = github_headers(body)
    send(client, "github", body, headers)
    receipt = WebhookReceipt.objects.get()
    signature = headers["X-Hub-Signature-256"]
    assert signature in stored_headers(WebhookReceipt, receipt.pk)

    # when: view-only staff open its page
    client.force_login(staff_user("view_webhookreceipt", "view_failedevent"))
    url = reverse("admin:webhook_receiver_webhookreceipt_change", args=[receipt.pk])
    page = client.get(url).content.decode()

    # then: the header is named, its value is not shown
    assert "X-Hub-Signature-256: [redacted]" in page
    assert signature.removeprefix("sha256=") not in page


# --- rows stored before: manage.py webhook_redact_headers ---------------------------------


def test_the_command_redacts_rows_stored_before_in_batches(client, settings, crash_handler):
    # given: receipts and a failed event stored with their signatures
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "KEEP_SIGNATURE_HEADERS": True}
    signatures = []
    for n in range(5):
        body = reserved(f"ord_{n}", ("SKU-1", 1))
        headers = standard_headers(body, msg_id=f"msg_old_{n}")
        signatures.append(headers["webhook-signature"])
        send(client, "shop", body, headers)
    failed = fail_crash(client, "msg_old_failed")
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "KEEP_SIGNATURE_HEADERS": False}
    before = {r.pk: dict(r.headers) for r in WebhookReceipt.objects.all()}

    # when: a dry run, then the run, two rows a batch
    out = StringIO()
    call_command("webhook_redact_headers", "--dry-run", "--batch-size", "2", stdout=out)
    assert "5 of 5 receipts" in out.getvalue() and "1 of 1 failed events" in out.getvalue()
    assert signatures[0] in stored_headers(WebhookReceipt, min(before))
    out = StringIO()
    call_command("webhook_redact_headers", "--batch-size", "2", stdout=out)

    # then: no row holds a signature; every other header is as it was
    assert "redacted 5 of 5 receipts" in out.getvalue()
    for receipt in WebhookReceipt.objects.all():
        raw = stored_headers(WebhookReceipt, receipt.pk)
        assert not any(signature in raw for signature in signatures)
        assert receipt.headers == {**before[receipt.pk], "Webhook-Signature": REDACTED}
    assert "v1," not in stored_headers(FailedEvent, failed.pk)
    # and a second run finds nothing left to do
    out = StringIO()
    call_command("webhook_redact_headers", stdout=out)
    assert "redacted 0 of 5 receipts" in out.getvalue()


# --- retries and replays never needed the signature ---------------------------------------


def test_a_redacted_failed_event_is_retried_and_applied(client, settings, crash_handler):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "RETRY_MAX_ATTEMPTS": 3}
    failed = fail_crash(client, "msg_retry_redacted")
    assert failed.headers["Webhook-Signature"] == REDACTED

    assert retry_failed_events(now=timezone.now() + timedelta(days=1)) == 1

    failed.refresh_from_db()
    assert (failed.status, failed.resolution) == (FailureStatus.RESOLVED, "applied")
    assert InventoryLedgerEntry.objects.filter(event_key="msg_retry_redacted").count() == 1


def test_a_redacted_github_dead_letter_is_replayed_with_its_type_from_the_headers(
    client, crash_handler
):
    # given: a GitHub delivery (its type is a header, X-GitHub-Event) whose handler fails
    body = github_body()
    headers = {**github_headers(body, delivery="gh-delivery-1"), "X-GitHub-Event": CRASH}
    handlers.failures_left["count"] = 1
    assert send(client, "github", body, headers)["status"] == "dead_lettered"
    failed = FailedEvent.objects.get(source="github")
    assert failed.headers["X-Hub-Signature-256"] == REDACTED

    # when: replayed, the fix deployed
    result = failed_event_replay(failed_id=failed.pk, actor="ops")

    # then
    assert result.result == "applied", result.detail
    assert WebhookReceipt.objects.get(source="github").event_type == CRASH
    assert InventoryLedgerEntry.objects.filter(event_key="gh-delivery-1").count() == 1
