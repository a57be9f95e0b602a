"""The relay through the egress proxy (EGRESS_PROXY), on a real CONNECT proxy and a real
merchant on loopback: deliveries go through its tunnels, with its credentials; its
refusal fails the message for good with the proxy's reason (the breaker not counted, as
for the egress guard); a silent, dropping or failing proxy is a network error, bounded
by the destination's timeout and retried with backoff; the password is never recorded
or logged."""

from __future__ import annotations

import logging
import time

import pytest

from tests.outbound.test_relay import admit
from tests.support.connect_proxy import DENY, DROP, HANG, RAW, connect_proxy
from tests.support.outbox import relay_merchant
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound.relay.process import relay_destination

pytestmark = pytest.mark.django_db

PASSWORD = "pr0xy-pa55word"


def through(settings, url: str) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_PROXY": url}


def recorded_text() -> str:
    """Everything the relay recorded about its attempts."""
    errors = [m.last_error for m in OutboxMessage.objects.all()]
    errors += [f"{a.error} {a.response_excerpt}" for a in DeliveryAttempt.objects.all()]
    return "\n".join(errors)


def test_deliveries_go_through_the_proxy_with_its_credentials(receiver, settings, caplog):
    caplog.set_level(logging.DEBUG)  # the relay's and aiohttp's own lines too
    with connect_proxy(credentials=("relay", PASSWORD)) as proxy:
        through(settings, proxy.url(f"relay:{PASSWORD}"))
        dest = relay_merchant(receiver.url.replace("127.0.0.1", "localhost"))
        admit(dest, "order:ord_1:paid:v1")
        admit(dest, "order:ord_2:paid:v1")

        sent, _ = relay_destination(destination_id=dest.pk)

    assert sent == 2
    assert sorted(receiver.keys()) == ["order:ord_1:paid:v1", "order:ord_2:paid:v1"]
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"delivered"}
    port = receiver.url.split(":")[2].split("/")[0]
    assert proxy.targets() and set(proxy.targets()) == {f"localhost:{port}"}
    assert proxy.tunnelled == len(proxy.connects)
    assert all(c.headers["proxy-authorization"].startswith("Basic ") for c in proxy.connects)
    assert "outbox: a round of" in caplog.text  # the relay's DEBUG lines were captured
    assert PASSWORD not in caplog.text and "cmVsYXk6" not in caplog.text  # nor its base64


@pytest.mark.parametrize("status", [407, 403])
def test_a_refusal_by_the_proxy_fails_the_message_for_good_with_its_reason(
    receiver, settings, caplog, django_capture_on_commit_callbacks, status
):
    with connect_proxy(mode=DENY, deny_status=status) as proxy:
        through(settings, proxy.url())
        dest = relay_merchant(receiver.url.replace("127.0.0.1", "localhost"))
        admit(dest, "order:ord_1:paid:v1")

        with django_capture_on_commit_callbacks(execute=True):
            sent, _ = relay_destination(destination_id=dest.pk)

    assert sent == 1 and receiver.received == []
    message = OutboxMessage.objects.get()
    assert message.status == "failed" and message.attempts == 1
    target = receiver.url.split("/")[2].replace("127.0.0.1", "localhost")
    assert message.last_error == (
        f"EgressProxyRefused: refused by the egress proxy http://127.0.0.1:{proxy.port}: "
        f"CONNECT {target}: HTTP {status} Request Rejected by Proxy: Egress proxy rejected "
        f"connection to {target}: denied by rule"
    )
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None and attempt.error == message.last_error
    # the proxy's rules, not the merchant, are at fault
    assert WebhookDestination.objects.get().consecutive_failures == 0
    [line] = [r.getMessage() for r in caplog.records if "EgressProxyRefused" in r.getMessage()]
    assert line.endswith(
        "attempt 1: failed for good (refused by the egress proxy), waiting for an operator"
    )


def test_wrong_credentials_fail_for_good_and_the_password_is_nowhere(
    receiver, settings, caplog, django_capture_on_commit_callbacks
):
    with connect_proxy(credentials=("relay", "another")) as proxy:
        through(settings, proxy.url(f"relay:{PASSWORD}"))
        dest = relay_merchant(receiver.url)
        admit(dest, "order:ord_1:paid:v1")

        with django_capture_on_commit_callbacks(execute=True):
            relay_destination(destination_id=dest.pk)

    message = OutboxMessage.objects.get()
    assert message.status == "failed"
    assert "HTTP 407 Proxy Authentication Required" in message.last_error
    assert f"http://***@127.0.0.1:{proxy.port}" in message.last_error
    assert "EgressProxyRefused" in caplog.text  # logged, without the password
    assert PASSWORD not in recorded_text() and PASSWORD not in caplog.text


@pytest.mark.parametrize(
    ("mode", "raw", "error"),
    [
        (HANG, b"", "ConnectTimeout: "),
        (DROP, b"", "ProxyError: "),
        (RAW, b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n", "ProxyError: "),
        (RAW, b"HTTP/1.1 504 Gateway Timeout\r\n\r\n", "ProxyError: "),
    ],
)
def test_a_silent_dropping_or_failing_proxy_is_retried_with_backoff_by_the_deadline(
    receiver, settings, mode, raw, error
):
    with connect_proxy(mode=mode, raw=raw) as proxy:
        through(settings, proxy.url())
        dest = relay_merchant(receiver.url, timeout_seconds=1)
        admit(dest, "order:ord_1:paid:v1")

        began = time.monotonic()
        sent, _ = relay_destination(destination_id=dest.pk)
        took = time.monotonic() - began

    assert sent == 1 and receiver.received == []
    assert took < 3, took  # the destination's timeout, from connect to the last byte
    message = OutboxMessage.objects.get()
    assert message.status == "pending" and message.attempts == 1
    assert message.last_error.startswith(error), message.last_error
    assert "egress proxy" in message.last_error
    assert message.next_attempt_at is not None
    # a network error: counted against the breaker, like a merchant that does not answer
    assert WebhookDestination.objects.get().consecutive_failures == 1
