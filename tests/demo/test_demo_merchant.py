"""The demo's sending half: the demo merchant (project/shop/merchant.py) verifies what
the relay signs, and `make run`'s ``demo_setup`` points the outbox at it, so that an
event sent to the shop comes back out to the merchant."""

from __future__ import annotations

import base64
import os
import time
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from project import devserver
from project.shop import events
from tests.support.http import post
from tests.support.signing import event_body, standard_headers
from tests.support.worker import relay_in_background, wait_for
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.network.egress import UrlRefused, check_url
from webhook_receiver.outbound.catalog import catalog
from webhook_receiver.outbound.relay.messages import Claimed
from webhook_receiver.outbound.relay.transport import signed_request

SECRET = "whsec_" + base64.b64encode(b"the demo merchant's 32-byte key!").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"somebody else's 32-byte key here").decode()
PAYLOAD = {"type": "order.paid", "data": {"order_id": "ord_1", "status": "paid", "version": 1}}


@pytest.fixture(autouse=True)
def merchant_settings(settings):
    settings.DEMO_MERCHANT_SECRET = SECRET
    settings.DEMO_MERCHANT_FAILURE_RATE = 0
    return settings


def signed(*, secret: str = SECRET, timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
    """A request as the relay signs it (transport.signed_request), for a destination
    signing with ``secret``."""
    destination = WebhookDestination(name="demo-merchant", secrets=[secret])
    message = Claimed(
        id=1,
        key="order:ord_1:paid:v1",
        event_type="order.paid",
        payload=PAYLOAD,
        attempt=1,
        failures=0,
        created_at=timezone.now(),
    )
    body, headers = signed_request(destination, message, timestamp or int(time.time()))
    headers.pop("content-type")  # the test client's content_type says it
    return body, headers


def deliver(body: bytes, headers: dict[str, str]):
    # CSRF checked as a browser's request would be: the endpoint is exempt
    client = Client(enforce_csrf_checks=True)
    return client.post("/demo-merchant/", body, content_type="application/json", headers=headers)


def setup(*args: str) -> str:
    out = StringIO()
    call_command("demo_setup", *args, stdout=out)
    return out.getvalue()


# --- the endpoint ----------------------------------------------------------------------


def test_a_webhook_the_relay_signs_is_received():
    response = deliver(*signed())

    assert response.status_code == 200
    assert response.json() == {"received": "order:ord_1:paid:v1"}


def tampered() -> tuple[bytes, dict[str, str]]:
    body, headers = signed()
    return body.replace(b"ord_1", b"ord_2"), headers


def unsigned() -> tuple[bytes, dict[str, str]]:
    body, headers = signed()
    del headers["webhook-signature"]
    return body, headers


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(lambda: signed(secret=OTHER_SECRET), id="another-secret"),
        pytest.param(tampered, id="body-changed"),
        pytest.param(unsigned, id="no-signature"),
        pytest.param(lambda: signed(timestamp=int(time.time()) - 600), id="ten-minutes-old"),
        pytest.param(lambda: signed(timestamp=int(time.time()) + 600), id="from-the-future"),
    ],
)
def test_a_request_that_does_not_verify_is_refused_with_401(request_):
    assert deliver(*request_()).status_code == 401


@pytest.mark.parametrize("secret", ["", "demo-merchant-change-me"])
def test_without_a_usable_secret_nothing_verifies(merchant_settings, secret):
    # unset, or .env.example's placeholder copied by hand
    merchant_settings.DEMO_MERCHANT_SECRET = secret

    assert deliver(*signed()).status_code == 401


def test_at_a_failure_rate_of_one_every_webhook_fails_with_500(merchant_settings):
    merchant_settings.DEMO_MERCHANT_FAILURE_RATE = 1.0

    assert deliver(*signed()).status_code == 500


def test_a_bad_signature_is_401_whatever_the_failure_rate(merchant_settings):
    merchant_settings.DEMO_MERCHANT_FAILURE_RATE = 1.0

    assert deliver(*signed(secret=OTHER_SECRET)).status_code == 401


def test_a_body_over_the_bound_is_refused_unread():
    _, headers = signed()

    response = deliver(b"x" * (256 * 1024 + 1), headers)

    assert response.status_code == 413


def test_it_takes_post_only():
    assert Client().get("/demo-merchant/").status_code == 405


# --- demo_setup ------------------------------------------------------------------------


@pytest.mark.django_db
def test_demo_setup_twice_leaves_one_destination_with_the_same_secret():
    first = setup("--host", "127.0.0.1", "--port", "8150")
    second = setup("--host", "127.0.0.1", "--port", "8150")

    destination = WebhookDestination.objects.get()
    assert destination.name == "demo-merchant"
    assert destination.tenant == "demo"
    assert destination.url == "http://127.0.0.1:8150/demo-merchant/"
    assert destination.secrets == [SECRET]
    assert destination.enabled
    assert first.startswith("demo_setup: created destination demo-merchant")
    assert second.startswith("demo_setup: unchanged destination demo-merchant")
    assert len(second.splitlines()) == 1


@pytest.mark.django_db
def test_demo_setup_follows_the_port_and_a_server_on_every_address():
    setup("--port", "8000")

    said = setup("--host", "0.0.0.0", "--port", "8150")

    # 0.0.0.0 is where it listens, not an address to send to: loopback reaches it
    destination = WebhookDestination.objects.get()
    assert destination.url == "http://127.0.0.1:8150/demo-merchant/"
    assert said.startswith("demo_setup: updated (url) destination demo-merchant")


@pytest.mark.django_db
def test_demo_setup_replaces_secrets_no_key_decrypts(settings, merchant_settings):
    # given: the destination of an earlier .env, whose key is gone with it
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    receiver = settings.WEBHOOK_RECEIVER
    settings.WEBHOOK_RECEIVER = {**receiver, "SECRET_ENCRYPTION_KEYS": [old_key]}
    setup()
    merchant_settings.DEMO_MERCHANT_SECRET = OTHER_SECRET

    # when: a fresh .env, with a new key and a new secret
    settings.WEBHOOK_RECEIVER = {**receiver, "SECRET_ENCRYPTION_KEYS": [new_key]}
    said = setup()

    # then
    assert "updated (secrets)" in said
    assert WebhookDestination.objects.get().secrets == [OTHER_SECRET]


@pytest.mark.django_db
def test_demo_setup_subscribes_to_every_event_the_shop_sends():
    setup()

    destination = WebhookDestination.objects.get()
    shop_types = [e.name for e in catalog() if e.serializer.__module__ == events.__name__]
    assert {"order.paid", "order.cancelled", "order.fulfilled"} <= set(shop_types)
    assert all(destination.subscribes_to(name) for name in shop_types)


@pytest.mark.django_db
@pytest.mark.parametrize("secret", ["", "demo-merchant-change-me"])
def test_without_a_usable_secret_demo_setup_says_so_and_does_nothing(merchant_settings, secret):
    merchant_settings.DEMO_MERCHANT_SECRET = secret

    said = setup()

    assert said.startswith("demo_setup: DEMO_MERCHANT_SECRET ")
    assert "no demo merchant destination" in said
    assert not WebhookDestination.objects.exists()


@pytest.mark.django_db
def test_under_make_run_the_relay_may_reach_the_demo_merchant(settings, tmp_path, monkeypatch):
    # given: the destination as `make run` sets it up, and nothing in the environment or
    # .env naming WEBHOOK_EGRESS_ALLOWED_NETWORKS
    setup()
    monkeypatch.setenv("WEBHOOK_EGRESS_ALLOWED_NETWORKS", "")  # put back as it was after
    monkeypatch.delenv("WEBHOOK_EGRESS_ALLOWED_NETWORKS")
    monkeypatch.setattr(devserver, "BASE_DIR", tmp_path)  # no .env there

    # when: devserver sets the environment its relay starts with
    devserver.allow_loopback_merchants()

    # then: the guard configured from it (as project/settings.py reads it) lets the
    # demo merchant's URL through
    allowed = os.environ["WEBHOOK_EGRESS_ALLOWED_NETWORKS"]
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": allowed}
    assert check_url(WebhookDestination.objects.get().url) == ""


@pytest.mark.django_db
def test_by_default_the_relay_may_not_reach_the_demo_merchant(settings):
    # the app's default, and production's: no internal network allowed
    setup()
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": []}

    with pytest.raises(UrlRefused, match="loopback"):
        check_url(WebhookDestination.objects.get().url)


@pytest.mark.django_db
def test_demo_setup_says_when_make_run_s_relay_may_not_reach_it():
    said = setup("--host", "192.168.1.5")

    assert WebhookDestination.objects.get().url == "http://192.168.1.5:8000/demo-merchant/"
    assert "Not loopback" in said and "WEBHOOK_EGRESS_ALLOWED_NETWORKS" in said


# --- end to end ------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_order_move_the_shop_receives_is_admitted_for_the_demo_merchant(client):
    setup()
    body = event_body("order.paid", order_id="ord_43", version=2)

    post(client, "shop", body, standard_headers(body, msg_id="msg_paid"))

    message = OutboxMessage.objects.get()
    assert (message.destination.name, message.key) == ("demo-merchant", "order:ord_43:paid:v2")


@pytest.mark.postgres_only("the relay's database thread writes while the test's reads")
def test_send_test_webhook_reaches_the_demo_merchant_through_the_relay(
    threaded_server, merchant_settings
):
    # given: the demo as `make run` serves it (its own endpoint and the demo merchant on one
    # server), set up by demo_setup, with a relay running; the merchant failing at first
    port = threaded_server.rsplit(":", 1)[1]
    setup("--host", "127.0.0.1", "--port", port)
    merchant_settings.DEMO_MERCHANT_FAILURE_RATE = 1.0
    attempts = DeliveryAttempt.objects.filter(message__destination__name="demo-merchant")

    with relay_in_background(poll_seconds=0.1):
        # when: the README's test event
        call_command(
            "send_test_webhook",
            "--type",
            "order.paid",
            "--url",
            f"{threaded_server}/webhooks/shop/",
        )

        # then: the merchant's 500 is retried, and once it answers 200 the message is delivered
        wait_for(lambda: attempts.filter(status_code=500).exists(), 20, "a failed attempt")
        merchant_settings.DEMO_MERCHANT_FAILURE_RATE = 0
        wait_for(lambda: attempts.filter(status_code=200).exists(), 30, "a delivery")

    message = OutboxMessage.objects.get()
    assert (message.event_type, message.status) == ("order.paid", "delivered")


@pytest.mark.postgres_only("the relay's database thread writes while the test's reads")
def test_by_default_the_relay_refuses_the_demo_merchant(threaded_server, settings):
    # given: the demo set up on a served instance whose relay allows no internal network
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": []}
    setup("--host", "127.0.0.1", "--port", threaded_server.rsplit(":", 1)[1])
    attempts = DeliveryAttempt.objects.filter(message__destination__name="demo-merchant")

    with relay_in_background(poll_seconds=0.1):
        # when
        call_command(
            "send_test_webhook",
            "--type",
            "order.paid",
            "--url",
            f"{threaded_server}/webhooks/shop/",
        )

        # then: the attempt is refused before any connection
        wait_for(lambda: attempts.exists(), 20, "an attempt")

    attempt = attempts.get()
    assert attempt.status_code is None and "refused by the egress guard" in attempt.error
