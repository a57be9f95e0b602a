"""The relay behind the egress guard: a destination on an internal address gets nothing,
and its message fails for good with the rule named, not retried, and the destination's
breaker is not counted (the address, not the merchant, is at fault)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.outbound.test_relay import admit
from tests.support.outbox import relay_merchant
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound.relay.process import relay_destination

pytestmark = pytest.mark.django_db


def _settings(allowed: list[str]):
    from django.conf import settings

    return override_settings(
        WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": allowed}
    )


def test_a_destination_on_loopback_is_refused_and_fails_for_good(
    receiver, caplog, django_capture_on_commit_callbacks
):
    with _settings([]):
        dest = relay_merchant(receiver.url.replace("127.0.0.1", "localhost"))
        admit(dest, "order:ord_1:paid:v1")

        with django_capture_on_commit_callbacks(execute=True):
            sent, _ = relay_destination(destination_id=dest.pk)

    assert sent == 1
    assert receiver.received == []
    message = OutboxMessage.objects.get()
    assert message.status == "failed"
    assert message.attempts == 1
    assert message.last_error.startswith(
        "EgressRefused: refused by the egress guard: localhost resolves to "
    )
    # the rule, not what the name resolves to (an internal DNS oracle for an editor)
    assert message.last_error.endswith("an address that is loopback")
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None
    assert attempt.error == message.last_error
    assert WebhookDestination.objects.get().consecutive_failures == 0
    # one log line, with the reason it will not be retried
    [line] = [r.getMessage() for r in caplog.records if "EgressRefused" in r.getMessage()]
    assert line.endswith(
        "attempt 1: failed for good (an address the egress guard refuses), waiting for an operator"
    )


def test_the_allow_list_lets_the_same_destination_through(receiver):
    with _settings(["127.0.0.0/8", "::1/128"]):
        dest = relay_merchant(receiver.url)
        admit(dest, "order:ord_1:paid:v1")

        sent, _ = relay_destination(destination_id=dest.pk)

    assert sent == 1
    assert len(receiver.received) == 1
    assert OutboxMessage.objects.get().status == "delivered"


def test_a_bad_allow_list_is_a_clear_configuration_error():
    from django.core.exceptions import ImproperlyConfigured

    from webhook_receiver.conf import app_settings

    with _settings(["10.0.0.0/33"]), pytest.raises(ImproperlyConfigured) as error:
        app_settings()
    assert "EGRESS_ALLOWED_NETWORKS" in str(error.value)
    assert "'10.0.0.0/33' is not a network" in str(error.value)
