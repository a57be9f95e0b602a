"""The egress guard: every internal address form refused, as resolved and at connect
time, against a real listening socket that must see no connection; the allow list lets
a network through."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.listener import Listener, listening
from webhook_receiver.conf import parse_networks
from webhook_receiver.network import peer_http
from webhook_receiver.network.egress import EgressGuard, EgressRefused

GUARD = EgressGuard()


@pytest.fixture
def listener() -> Iterator[Listener]:
    with listening() as server:
        yield server


def _post(url: str, guard: EgressGuard = GUARD) -> httpx.Response:
    with peer_http.client(timeout=3.0, guard=guard) as client, peer_http.deadline(3.0):
        return client.post(url, content=b"{}")


# every form of an internal address, as a URL's host: each resolves to the loopback
# address the listener is on, or to another internal one
LOOPBACK_FORMS = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "localhost"]


@pytest.mark.parametrize("host", LOOPBACK_FORMS)
def test_every_loopback_form_is_refused_before_a_connection(listener, host):
    with pytest.raises(EgressRefused, match="is loopback") as refused:
        _post(f"http://{host}:{listener.port}/hook")
    assert listener.connections() == 0
    assert refused.value.address == "127.0.0.1"
    # an address written otherwise is named; what a name resolves to is not (the log has it)
    assert ("127.0.0.1" in str(refused.value)) == (host != "localhost")


# the other forms the save-time check refuses (tests/core/test_check_url.py), each at a
# real listening socket's port: the IPv4 one's (0.0.0.0 and the IPv4-mapped form reach
# it when let through), or the one on ::1
OTHER_FORMS = ["0.0.0.0", "[::ffff:127.0.0.1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]"]


@pytest.mark.parametrize("host", OTHER_FORMS)
def test_every_other_internal_form_is_refused_before_a_connection(listener, host):
    with pytest.raises(EgressRefused):
        _post(f"http://{host}:{listener.port}/hook")
    assert listener.connections() == 0


def test_ipv6_loopback_is_refused_before_a_connection():
    with listening(socket.AF_INET6, "::1") as server:
        with pytest.raises(EgressRefused, match="::1, which is loopback"):
            _post(f"http://[::1]:{server.port}/hook")
        assert server.connections() == 0


def test_a_form_httpx_refuses_sends_nothing_either(listener):
    # octal: httpx's own parser refuses it as a URL, before any resolution
    with pytest.raises(httpx.InvalidURL):
        _post(f"http://0177.0.0.1:{listener.port}/hook")
    assert listener.connections() == 0


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("0.0.0.0", "unspecified"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared address space"),
        ("[::1]", "loopback"),
        ("[::]", "unspecified"),
        ("[::ffff:127.0.0.1]", "IPv6 form of 127.0.0.1: loopback"),
        ("[::ffff:7f00:1]", "IPv6 form of 127.0.0.1: loopback"),
        ("[::127.0.0.1]", "IPv6 form of 127.0.0.1: loopback"),
        ("[::ffff:169.254.169.254]", "IPv6 form of 169.254.169.254: link-local"),
        ("[2002:7f00:1::]", "IPv6 form of 127.0.0.1: loopback"),
        ("[64:ff9b::7f00:1]", "NAT64"),
        ("[fe80::1]", "link-local"),
        ("[fd00::1]", "private"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "reserved"),
    ],
)
def test_internal_addresses_are_refused_with_the_rule_named(host, rule):
    # a port nothing listens on: the text must not depend on it (no connection is made)
    with pytest.raises(EgressRefused) as refused:
        _post(f"http://{host}:9/hook")
    assert rule in str(refused.value)
    assert str(refused.value).startswith("refused by the egress guard: ")


def test_the_text_is_the_same_for_an_open_and_a_closed_port(listener):
    texts = set()
    for port in (listener.port, 9):
        with pytest.raises(EgressRefused) as refused:
            _post(f"http://127.0.0.1:{port}/hook")
        texts.add(str(refused.value))
    assert texts == {"refused by the egress guard: 127.0.0.1, which is loopback"}
    assert listener.connections() == 0


def test_a_name_names_its_address(listener):
    with pytest.raises(EgressRefused) as refused:
        _post(f"http://localhost:{listener.port}/")
    assert "localhost resolves to " in str(refused.value)


def test_the_allow_list_lets_a_network_through(listener):
    guard = EgressGuard(allowed=parse_networks("127.0.0.0/8, ::1/128"))
    # it connects; the listener never answers
    with pytest.raises(httpx.HTTPError), peer_http.client(timeout=0.5, guard=guard) as client:
        client.post(f"http://127.0.0.1:{listener.port}/hook", content=b"{}")
    assert listener.connections() == 1
    # and only that network: a private address is still refused
    with pytest.raises(EgressRefused, match="private"):
        _post("http://10.1.2.3:9/", guard)


def test_a_client_without_a_guard_connects_as_before(listener):
    with pytest.raises(httpx.HTTPError), peer_http.client(timeout=0.5) as client:
        client.post(f"http://127.0.0.1:{listener.port}/hook", content=b"{}")
    assert listener.connections() == 1


def test_parse_networks_names_a_bad_entry():
    assert parse_networks("") == ()
    assert parse_networks(["10.0.0.0/8", "192.0.2.7"]) == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.0.2.7/32"),
    )
    with pytest.raises(ValueError, match="'10.0.0.0/33' is not a network"):
        parse_networks("127.0.0.0/8,10.0.0.0/33")


# --- every address, by rule -----------------------------------------------------------

INTERNAL_V4 = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
INTERNAL_V4 += ["169.254.0.0/16", "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"]


def _in(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address]:
    network = ipaddress.ip_network(cidr)
    first, size = int(network.network_address), network.num_addresses
    return st.integers(0, size - 1).map(lambda n: ipaddress.IPv4Address(first + n))


internal_v4 = st.sampled_from(INTERNAL_V4).flatmap(_in)


@given(internal_v4)
def test_every_internal_ipv4_address_is_refused_in_every_ipv6_form(address):
    assert GUARD.refusal(address) is not None
    n = int(address)
    forms = [
        ipaddress.IPv6Address(0xFFFF << 32 | n),  # ::ffff:a.b.c.d
        ipaddress.IPv6Address(0x2002 << 112 | n << 80),  # 6to4
    ]
    if n > 1:
        forms.append(ipaddress.IPv6Address(n))  # ::a.b.c.d
    for form in forms:
        assert GUARD.refusal(form) is not None, form


@given(st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address))
def test_an_ipv4_address_is_allowed_only_when_global(address):
    # ipaddress counts multicast (224.0.0.0/4) as global; the guard refuses it by name
    assert (GUARD.refusal(address) is None) == (address.is_global and not address.is_multicast)


@given(st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address))
def test_an_allowed_ipv6_address_is_global_and_carries_no_internal_ipv4(address):
    if GUARD.refusal(address) is None:
        assert address.is_global
        if address.ipv4_mapped is not None:
            assert address.ipv4_mapped.is_global


def test_public_addresses_are_allowed():
    for text in ("93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"):
        assert GUARD.refusal(ipaddress.ip_address(text)) is None, text
