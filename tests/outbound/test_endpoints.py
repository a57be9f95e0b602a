"""Endpoints as their owner manages them (outbound/endpoints.py): checked fields, a new
endpoint's secret made once, a rotation whose old secrets sign until the overlap ends
(verified as a merchant verifies), a test event from the catalog's example."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.outbox import destination
from webhook_receiver.exceptions import InvalidSignature
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound.endpoints import (
    EndpointFields,
    EndpointRefused,
    endpoint_checked,
    endpoint_create,
    endpoint_update,
    secret_rotate,
    send_test_event,
)
from webhook_receiver.outbound.relay.messages import Claimed
from webhook_receiver.outbound.relay.transport import signed_request
from webhook_receiver.outbound.tenancy import tenant_scope
from webhook_receiver.schemes.standard import StandardWebhooks

pytestmark = pytest.mark.django_db

ACME = tenant_scope("acme")
FIELDS = EndpointFields("https://hooks.acme.example/in", ["order.*"], {"data.status": "paid"})


def verified_by(dest: WebhookDestination, secret: str, at: float) -> bool:
    """Whether a merchant holding ``secret`` verifies a request the relay signs at ``at``."""
    claimed = Claimed(1, "k-1", "order.paid", {"n": 1}, 1, 0, timezone.now())
    body, headers = signed_request(dest, claimed, int(at))
    try:
        StandardWebhooks().verify(secrets=(secret,), headers=headers, body=body)
    except InvalidSignature:
        return False
    return True


def test_fields_are_checked_as_saving_needs():
    fields, warning = endpoint_checked(" https://1.1.1.1/in ", ["order.*", "order.*", " "], {})
    assert fields == EndpointFields("https://1.1.1.1/in", ["order.*"], None, "") and warning == ""

    with pytest.raises(EndpointRefused) as refused:
        endpoint_checked("http://169.254.169.254/latest", ["no.such"], {"$bogus": 1}, "x" * 201)

    problems = refused.value.problems
    assert set(problems) == {"url", "event_types", "filter", "description"}
    assert problems["url"].startswith("refused by the egress guard")


def test_a_new_endpoint_is_its_tenants_with_a_made_name_and_a_secret_given_once():
    made, secret = endpoint_create(scope=ACME, fields=FIELDS, by="portal")

    assert made.tenant == "acme" and made.name.startswith("acme-") and made.enabled
    assert secret.startswith("whsec_") and made.secrets == [secret]
    assert (made.event_types, made.filter) == (["order.*"], {"data.status": "paid"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM webhook_receiver_webhookdestination")
        assert secret not in str(cursor.fetchall())  # encrypted at rest


def test_an_update_changes_what_its_owner_sets_and_nothing_of_another_tenant():
    dest = destination("acme-shop", tenant="acme")
    changed = EndpointFields("https://new.example/in", ["order.paid"], None, "orders")

    endpoint_update(scope=ACME, destination=dest.pk, fields=changed, by="portal")

    dest.refresh_from_db()
    assert (dest.url, dest.event_types, dest.filter, dest.description) == (
        "https://new.example/in",
        ["order.paid"],
        None,
        "orders",
    )
    with pytest.raises(WebhookDestination.DoesNotExist):
        endpoint_update(scope=tenant_scope("bolt"), destination=dest.pk, fields=FIELDS, by="b")


def test_after_a_rotation_the_old_secret_signs_until_the_overlap_ends():
    dest, old = endpoint_create(scope=ACME, fields=FIELDS, by="portal")
    now = timezone.now()

    new = secret_rotate(scope=ACME, destination=dest, overlap=timedelta(hours=1), by="p", now=now)

    dest.refresh_from_db()
    assert new != old and dest.secrets == [new] and dest.retiring_secrets == [old]
    during, after = now.timestamp() + 3598, now.timestamp() + 3601
    assert verified_by(dest, new, during) and verified_by(dest, old, during)
    assert verified_by(dest, new, after) and not verified_by(dest, old, after)


def test_rotating_twice_keeps_the_live_ones_and_no_overlap_ends_the_old_at_once():
    dest, first = endpoint_create(scope=ACME, fields=FIELDS, by="portal")
    second = secret_rotate(scope=ACME, destination=dest, overlap=timedelta(days=1), by="p")
    third = secret_rotate(scope=ACME, destination=dest, overlap=timedelta(hours=1), by="p")
    dest.refresh_from_db()
    assert dest.retiring_secrets == [second, first]  # both still signed when it rotated

    fourth = secret_rotate(scope=ACME, destination=dest, overlap=timedelta(0), by="p")

    dest.refresh_from_db()
    assert dest.retiring_secrets == [] and dest.retiring_until is None
    assert verified_by(dest, fourth, time.time()) and not verified_by(dest, third, time.time())


def test_a_signing_key_is_rotated_to_a_signing_key():
    dest = destination("acme-keyed", tenant="acme", secrets=["whsk_" + "A" * 43 + "="])
    new = secret_rotate(scope=ACME, destination=dest, overlap=timedelta(0), by="p")
    assert new.startswith("whsk_")


@pytest.mark.parametrize("overlap", [timedelta(seconds=-1), timedelta(days=7, seconds=1)])
def test_an_overlap_is_at_most_a_week(overlap):
    dest = destination("acme-shop", tenant="acme")
    with pytest.raises(ValueError, match="between 0 and 7 days"):
        secret_rotate(scope=ACME, destination=dest, overlap=overlap, by="p")


def test_a_test_event_goes_to_that_endpoint_alone_with_the_catalogs_example():
    dest = destination("acme-shop", tenant="acme", event_types=["order.*"])
    destination("acme-other", tenant="acme", event_types=["order.*"])

    admitted = send_test_event(scope=ACME, destination=dest.pk, event_type="order.paid", by="p")

    sent = OutboxMessage.objects.get()
    assert admitted.created and sent.destination == dest and sent.key.startswith("test:")
    assert sent.payload["type"] == "order.paid" and sent.payload["data"]["status"] == "paid"
    assert sent.metadata == {"test_by": "p"} and sent.status == "pending"
    with pytest.raises(ValueError, match="not an event type of the catalog"):
        send_test_event(scope=ACME, destination=dest.pk, event_type="no.such", by="p")
    with pytest.raises(WebhookDestination.DoesNotExist):
        send_test_event(
            scope=tenant_scope("bolt"), destination=dest.pk, event_type="order.paid", by="p"
        )
