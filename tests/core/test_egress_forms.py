"""The egress guard's last gaps: every IPv6 form that carries an IPv4 address is judged by
it, the blocks no public service uses are refused (site-local, IPv6's reserved ::/8,
3fff::/20, 5f00::/16), an allowed IPv4 network admits none of its IPv6 wrappers, a
name's refusal does not say what it resolves to, the literal forms a proxy would resolve
(``[::1%25lo]``, ``127.0.0.1.``, ``127.0.0.1%2e``) are literals, and the stripe
adapter's API base is guarded like any address someone typed."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook_receiver.network.egress import EgressGuard, EgressRefused, literal_addresses
from webhook_receiver.reconcile.adapters import SenderUnavailable
from webhook_receiver.reconcile.adapters.stripe import list_events

GUARD = EgressGuard()
INTERNAL_V4 = [
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16", "100.64.0.0/10")
]


def v6(value: int) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(value)


def wrappers(v4: ipaddress.IPv4Address) -> dict[str, ipaddress.IPv6Address]:
    """Every IPv6 form that carries ``v4``."""
    n = int(v4)
    return {
        "mapped": v6((0xFFFF << 32) | n),
        "translated": v6((0xFFFF << 48) | n),
        "compatible": v6(n),
        "6to4": v6((0x2002 << 112) | (n << 80) | 1),
        "teredo": v6((0x20010000 << 96) | ((n ^ 0xFFFFFFFF) & 0xFFFFFFFF)),
        "NAT64": v6((0x64FF9B << 96) | n),
    }


internal_v4 = (
    st.sampled_from(INTERNAL_V4)
    .flatmap(lambda net: st.integers(int(net.network_address) + 1, int(net.broadcast_address) - 1))
    .map(ipaddress.IPv4Address)
)


@given(internal_v4)
def test_every_ipv6_form_of_an_internal_ipv4_address_is_refused(v4):
    for form, address in wrappers(v4).items():
        assert GUARD.refusal(address) is not None, (form, address)


@given(internal_v4)
def test_an_allowed_ipv4_network_admits_none_of_its_ipv6_wrappers(v4):
    allowed = EgressGuard(allowed=tuple(n for n in INTERNAL_V4 if v4 in n))
    assert allowed.refusal(v4) is None
    for form, address in wrappers(v4).items():
        assert allowed.refusal(address) is not None, (form, address)


@given(st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address))
def test_only_the_mapped_form_of_a_public_ipv4_address_may_pass(v4):
    if GUARD.refusal(v4) is not None:
        return
    forms = wrappers(v4)
    assert GUARD.refusal(forms.pop("mapped")) is None  # connects to the IPv4 address itself
    for form, address in forms.items():
        if form in ("6to4", "teredo"):
            continue  # routed tunnels to a public address: judged by it, let through
        assert GUARD.refusal(address) is not None, (form, address)


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("fec0::1", "site-local (deprecated)"),
        ("feff:ffff::1", "site-local (deprecated)"),
        ("3fff::1", "reserved"),
        ("5f00::1", "reserved"),
        ("::ffff:0:8.8.8.8", "reserved"),
        ("::8.8.8.8", "reserved"),
        ("0:0:0:1::1", "reserved"),
    ],
)
def test_blocks_no_public_service_uses_are_refused(address, rule):
    assert GUARD.refusal(ipaddress.ip_address(address)) == rule


def test_a_names_refusal_keeps_its_address_for_the_log(caplog):
    with (
        caplog.at_level(logging.WARNING, logger="webhook_receiver.network.egress"),
        pytest.raises(EgressRefused) as refused,
    ):
        GUARD.check("db.internal.example", [ipaddress.ip_address("127.0.0.9")])
    assert str(refused.value) == (
        "refused by the egress guard: db.internal.example resolves to an address that is loopback"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "egress guard: refused: host=db.internal.example address=127.0.0.9 rule=loopback"
    ]


@pytest.mark.parametrize("host", ["[::1%25lo]", "[::1%lo]", "127.0.0.1.", "127.0.0.1%2e"])
def test_a_literal_a_proxy_would_resolve_is_checked_as_the_address_it_is(host):
    addresses = literal_addresses(host)
    assert addresses and all(a.is_loopback for a in addresses)
    with pytest.raises(EgressRefused, match="loopback"):
        GUARD.check(host, addresses)


@pytest.mark.django_db
def test_the_stripe_adapters_api_base_is_guarded(settings):
    # given: a local server as API_BASE, and no network allowed past the guard
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": []}
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    connections: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            connections.append(server.accept())

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    until = datetime.now(UTC)

    # when
    with pytest.raises(SenderUnavailable, match="refused by the egress guard"):
        for _ in list_events(
            options={"API_KEY": "rk_test_x", "API_BASE": f"http://127.0.0.1:{port}"},
            since=until - timedelta(hours=1),
            until=until,
        ):
            pass

    # then: no connection was made
    server.close()
    assert connections == []
