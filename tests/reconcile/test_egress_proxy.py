"""The http reconciliation adapter through the egress proxy (EGRESS_PROXY), on a real
CONNECT proxy and a real sender on loopback: its pages come through the proxy's tunnel;
the proxy's refusal fails the run at once (no retry changes it), with the proxy's
reason; a proxy that answers 502 is retried like a network error. The stripe adapter
goes through it too, and the SDK does not retry a refusal."""

from __future__ import annotations

import pytest

from tests.reconcile.test_hostile import http_source, later, page, record
from tests.support.connect_proxy import DENY, RAW, connect_proxy
from tests.support.peers import answer, hostile_peer
from tests.support.reconciling import reconcile_with
from webhook_receiver.reconcile.run import reconciliation_run

pytestmark = pytest.mark.django_db

PASSWORD = "rec0ncile-pa55"


def through(settings, url: str) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_PROXY": url}


def named(url: str) -> str:
    """The sender's URL by host name, for the proxy to resolve."""
    return url.replace("127.0.0.1", "localhost")


def test_the_listing_comes_through_the_proxy(settings):
    listing = answer(200, {}, page([record("evt_1")]))
    with (
        hostile_peer(lambda request: [(0, listing)], path="/events") as sender,
        connect_proxy(credentials=("recon", PASSWORD)) as proxy,
    ):
        http_source(settings, named(sender.url))
        through(settings, proxy.url(f"recon:{PASSWORD}"))

        run = reconciliation_run(source_slug="shop", now=later())

    # the sender's one event, never received here: found missing, so the listing came
    assert run.outcome == "needs_repair", run.error
    assert run.sender_records == 1
    port = sender.url.split(":")[2].split("/")[0]
    assert proxy.targets() == [f"localhost:{port}"] and proxy.tunnelled == 1
    assert len(sender.requests) == 1


def test_a_refusal_by_the_proxy_fails_the_run_at_once_with_its_reason(settings):
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, page([])))], path="/events") as sender,
        connect_proxy(mode=DENY) as proxy,
    ):
        http_source(settings, named(sender.url), RETRIES=3)
        through(settings, proxy.url())

        run = reconciliation_run(source_slug="shop", now=later())

    assert run.outcome == "failed"
    assert run.error.startswith(
        f"SenderUnavailable: refused by the egress proxy http://127.0.0.1:{proxy.port}: "
        "CONNECT localhost:"
    ), run.error
    assert "HTTP 407 Request Rejected by Proxy" in run.error
    assert len(proxy.connects) == 1  # not retried
    assert sender.requests == []


def test_a_proxy_answering_502_is_retried_like_a_network_error(settings):
    bad_gateway = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, page([])))], path="/events") as sender,
        connect_proxy(mode=RAW, raw=bad_gateway) as proxy,
    ):
        http_source(settings, named(sender.url), RETRIES=1)
        through(settings, proxy.url())

        run = reconciliation_run(source_slug="shop", now=later())

    assert run.outcome == "failed"
    assert "ProxyError: the egress proxy" in run.error and "HTTP 502 Bad Gateway" in run.error
    assert "after 2 attempts" in run.error
    assert len(proxy.connects) == 2


def test_the_stripe_adapter_goes_through_the_proxy_and_a_refusal_is_not_retried(settings):
    options = {"API_KEY": "sk_test_local", "TIMEOUT": 2, "MAX_NETWORK_RETRIES": 2}
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, b"{}"))], path="") as api,
        connect_proxy(mode=DENY) as proxy,
    ):
        api_base = named(api.url)
        reconcile_with(
            settings, "stripe", ADAPTER="stripe", OPTIONS={**options, "API_BASE": api_base}
        )
        through(settings, proxy.url())

        run = reconciliation_run(source_slug="stripe", now=later())

    assert run.outcome == "failed"
    assert "refused by the egress proxy" in run.error, run.error
    assert proxy.targets() == [api_base.split("//")[1]]  # once: the SDK did not retry it
    assert api.requests == []
