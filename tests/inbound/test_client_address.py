"""The client's address on the audit record: REMOTE_ADDR, or, behind TRUSTED_PROXIES,
the rightmost hop of X-Forwarded-For that no trusted proxy is. The header is anyone's to
write: it is never read without the setting, a client cannot choose the address
recorded, and no header costs a request its record. (Through a real nginx:
tests/test_served.py.)"""

from __future__ import annotations

import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.settings import WEBHOOK_RECEIVER
from tests.support.fuzzing import PURE, texts
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.conf import TrustedProxies, app_settings
from webhook_receiver.inbound.audit import (
    MAX_FORWARDED_HOPS,
    client_address,
    forwarded_client_address,
    request_client_address,
)
from webhook_receiver.models import RequestAudit

NGINX = "127.0.0.1"
ONE = TrustedProxies(count=1)
TWO = TrustedProxies(count=2)
PRIVATE = TrustedProxies(
    networks=(ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.0.0.0/8"))
)


@pytest.mark.parametrize(
    ("proxies", "remote_addr", "forwarded_for", "client"),
    [
        # one proxy (nginx): the entry it appended, whatever the client wrote before it
        (ONE, NGINX, "203.0.113.9", "203.0.113.9"),
        (ONE, NGINX, "6.6.6.6, 203.0.113.9", "203.0.113.9"),
        (ONE, NGINX, "6.6.6.6,203.0.113.9 ", "203.0.113.9"),
        (ONE, NGINX, "2001:db8::7", "2001:db8::7"),
        (ONE, NGINX, "[2001:db8::7]:4711", "2001:db8::7"),
        (ONE, NGINX, "203.0.113.9:4711", "203.0.113.9"),
        (ONE, NGINX, "fe80::1%eth0", "fe80::1"),
        # no header, an empty one, or garbage where nginx writes: the proxy's own
        # address, the one known for sure (never a value the client chose)
        (ONE, NGINX, None, NGINX),
        (ONE, NGINX, "", NGINX),
        (ONE, NGINX, "unknown", NGINX),
        (ONE, NGINX, "203.0.113.9, not-an-address", NGINX),
        (ONE, NGINX, "203.0.113.9,", NGINX),
        # two proxies (a balancer, then nginx): the balancer's entry
        (TWO, NGINX, "6.6.6.6, 203.0.113.9, 10.0.0.5", "203.0.113.9"),
        # … and when the balancer was bypassed, the chain ends at the last address known
        (TWO, NGINX, "203.0.113.9", "203.0.113.9"),
        (TWO, NGINX, "garbage, 203.0.113.9", "203.0.113.9"),
        # trusted networks: walk left while the hop is one of ours
        (PRIVATE, NGINX, "6.6.6.6, 203.0.113.9, 10.0.0.5", "203.0.113.9"),
        (PRIVATE, NGINX, "10.0.0.9, 10.0.0.5", "10.0.0.9"),
        (PRIVATE, "203.0.113.9", "6.6.6.6", "203.0.113.9"),  # not from a proxy: not read
        (PRIVATE, NGINX, "10.0.0.5, bogus", NGINX),
        # no REMOTE_ADDR (nginx on a Unix socket): a count trusts the nearest peer by
        # position; networks cannot tell it is one of theirs
        (ONE, "", "203.0.113.9", "203.0.113.9"),
        (ONE, None, "6.6.6.6, 203.0.113.9", "203.0.113.9"),
        (ONE, None, "garbage", None),
        (PRIVATE, "", "203.0.113.9", None),
    ],
)
def test_the_client_is_the_rightmost_hop_no_trusted_proxy_is(
    proxies, remote_addr, forwarded_for, client
):
    assert forwarded_client_address(remote_addr, forwarded_for, proxies) == client


def test_without_the_setting_the_header_is_never_read(settings):
    meta = {"REMOTE_ADDR": "198.51.100.4", "HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    assert app_settings().trusted_proxies is None
    assert request_client_address(meta) == "198.51.100.4"

    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "TRUSTED_PROXIES": 1}
    assert request_client_address(meta) == "203.0.113.9"


def test_a_header_of_thousands_of_entries_costs_a_bounded_walk():
    # every entry a trusted address: the walk stops after MAX_FORWARDED_HOPS of them
    header = ", ".join(f"10.0.{n // 250}.{n % 250 + 1}" for n in range(5000))
    client = forwarded_client_address(NGINX, header, PRIVATE)
    entries = [e.strip() for e in header.split(",")]
    assert client == entries[-MAX_FORWARDED_HOPS]


# --- the setting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        (0, None),
        ("", None),
        (1, ONE),
        ("2", TWO),
        (["127.0.0.0/8", "10.0.0.0/8"], PRIVATE),
        ("127.0.0.0/8, 10.0.0.0/8", PRIVATE),
        ("127.0.0.1", TrustedProxies(networks=(ipaddress.ip_network("127.0.0.1/32"),))),
    ],
)
def test_the_setting_takes_a_count_or_networks(settings, value, parsed):
    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "TRUSTED_PROXIES": value}
    assert app_settings().trusted_proxies == parsed


@pytest.mark.parametrize("value", [-1, True, "nginx", ["10.0.0.0/33"], {"a": 1}])
def test_a_setting_that_is_neither_is_refused_at_start(settings, value):
    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "TRUSTED_PROXIES": value}
    with pytest.raises(ImproperlyConfigured, match="TRUSTED_PROXIES"):
        app_settings()


# --- through the endpoint ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("forwarded_for", ["203.0.113.9", "junk, [[", "\u00e9\u0000", "," * 3000])
def test_no_header_costs_a_request_its_record(client, settings, forwarded_for):
    # given: nginx in front, trusted
    settings.WEBHOOK_RECEIVER = {**WEBHOOK_RECEIVER, "TRUSTED_PROXIES": 1}
    body = reserved("ord_1", ("SKU-1", 1))
    meta = {"REMOTE_ADDR": NGINX, "HTTP_X_FORWARDED_FOR": forwarded_for}

    # when: a delivery and a refusal
    delivered = post(client, "shop", body, standard_headers(body), **meta)
    refused = post(client, "shop", body, {}, **meta)

    # then: both answered and recorded, with the forwarded address or the proxy's
    assert (delivered.status_code, refused.status_code) == (200, 400)
    expected = "203.0.113.9" if forwarded_for == "203.0.113.9" else NGINX
    assert list(RequestAudit.objects.values_list("remote_addr", flat=True)) == [expected] * 2


# --- fuzzed ------------------------------------------------------------------------------------

ADDRESSES = st.ip_addresses().map(str)
ENTRIES = ADDRESSES | st.text(max_size=20) | st.sampled_from(["", " ", "unknown", "[::1]:80"])
NETWORKS = st.one_of(
    st.tuples(st.ip_addresses(v=4), st.integers(0, 32)),
    st.tuples(st.ip_addresses(v=6), st.integers(0, 128)),
).map(lambda pair: ipaddress.ip_network(f"{pair[0]}/{pair[1]}", strict=False))
PROXIES = st.one_of(
    st.integers(min_value=1, max_value=20).map(lambda n: TrustedProxies(count=n)),
    st.lists(NETWORKS, min_size=1, max_size=4).map(
        lambda nets: TrustedProxies(networks=tuple(nets))
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    proxies=PROXIES,
    remote_addr=ADDRESSES | st.text(max_size=20),
    entries=st.lists(ENTRIES, max_size=30),
)
def test_any_header_gives_an_address_of_the_chain_or_none(proxies, remote_addr, entries):
    forwarded_for = ",".join(entries)

    client = forwarded_client_address(remote_addr, forwarded_for, proxies)

    # an address the database accepts, taken from the chain (never made up), or None
    # when REMOTE_ADDR itself is none and the header gave none either
    if client is None:
        assert forwarded_client_address(remote_addr, None, proxies) is None
        return
    assert str(ipaddress.ip_address(client)) == client
    chain = {forwarded_client_address(remote_addr, None, proxies)}
    for entry in forwarded_for.split(","):
        chain.add(forwarded_client_address(NGINX, entry, TrustedProxies(count=1)))
    assert client in chain


@PURE
@given(value=st.none() | texts("any") | st.ip_addresses().map(str))
def test_a_remote_address_is_an_address_or_nothing(value):
    """REMOTE_ADDR can be anything a server passes on: inet accepts what is kept."""
    address = client_address(value)

    assert address is None or str(ipaddress.ip_address(address)) == address


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=st.text(max_size=300) | st.lists(ENTRIES, max_size=20).map(",".join))
@example(header="::FFFF:0:0")  # IPv4-mapped: SQLite's field spells it ::ffff:0.0.0.0
def test_any_forwarded_header_leaves_a_delivery_applied_and_recorded(client, header):
    # given: nginx in front, trusted, and whatever the header says
    body = reserved(f"ord_{abs(hash(header))}", ("SKU-1", 1))
    meta = {"REMOTE_ADDR": NGINX, "HTTP_X_FORWARDED_FOR": header}
    before = RequestAudit.objects.count()

    # when
    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "TRUSTED_PROXIES": 1}):
        answer = post(client, "shop", body, standard_headers(body), **meta)

    # then: applied (or a duplicate of an earlier example), with one record that holds
    # the header's rightmost entry when it is an address, else nginx's
    assert answer.status_code == 200, answer.content
    assert RequestAudit.objects.count() == before + 1
    # (the same address: the database may spell an IPv4-mapped one its own way)
    recorded = ipaddress.ip_address(RequestAudit.objects.latest("id").remote_addr)
    assert recorded == ipaddress.ip_address(forwarded_client_address(NGINX, header, ONE))
