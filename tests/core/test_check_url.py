"""check_url: the egress guard when a URL is saved. Every form of an internal address is
refused with its rule named, as are credentials in a URL and schemes other than http(s);
a name that does not resolve is let through with a warning (the guard holds at send)."""

from __future__ import annotations

import ipaddress
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook_receiver.conf import parse_networks
from webhook_receiver.network.egress import EgressGuard, UrlRefused, check_url

GUARD = EgressGuard()
LOOPBACK = EgressGuard(allowed=parse_networks("127.0.0.0/8, ::1/128"))

# (host as typed, the rule the refusal names)
REFUSED_FORMS = [
    ("2130706433", "2130706433 resolves to 127.0.0.1, which is loopback"),
    ("0x7f000001", "0x7f000001 resolves to 127.0.0.1, which is loopback"),
    ("127.1", "127.1 resolves to 127.0.0.1, which is loopback"),
    ("127.0.0.1", "127.0.0.1, which is loopback"),
    ("[::ffff:127.0.0.1]", "an IPv6 form of 127.0.0.1: loopback"),
    ("[::1]", "::1, which is loopback"),
    ("0.0.0.0", "0.0.0.0, which is unspecified"),
    ("169.254.169.254", "169.254.169.254, which is link-local"),
    ("10.0.0.1", "10.0.0.1, which is private"),
    ("localhost", "localhost resolves to "),
    ("[64:ff9b::7f00:1]", "64:ff9b::7f00:1, which is NAT64"),
    ("[::127.0.0.1]", "an IPv6 form of 127.0.0.1: loopback"),
]


@pytest.mark.parametrize(("host", "rule"), REFUSED_FORMS)
def test_every_internal_form_is_refused_with_its_rule(host, rule):
    with pytest.raises(UrlRefused) as refused:
        check_url(f"https://{host}/hooks?token=abc", GUARD)
    assert str(refused.value).startswith("refused by the egress guard: ")
    assert rule in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_the_allow_list_lets_loopback_through():
    assert check_url("http://127.0.0.1:8000/hooks", LOOPBACK) == ""
    assert check_url("http://localhost:8000/hooks", LOOPBACK) == ""
    with pytest.raises(UrlRefused, match="private"):
        check_url("http://10.0.0.1/hooks", LOOPBACK)


@pytest.mark.parametrize(
    "url", ["https://user:pass@merchant.example/", "https://token@merchant.example/"]
)
def test_credentials_in_the_url_are_refused(url):
    with pytest.raises(UrlRefused) as refused:
        check_url(url, LOOPBACK)
    assert "credentials do not belong in the URL; put the secret in the secret field" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://merchant.example/", "only http and https URLs are sent to, not ftp:"),
        ("file:///etc/passwd", "not file:"),
        ("gopher://127.0.0.1:6379/_INFO", "not gopher:"),
        ("merchant.example/hooks", "only http and https"),
        ("https:///hooks", "the URL names no host"),
        ("https://[::1/", "not a URL"),
    ],
)
def test_what_is_not_an_http_url_is_refused(url, words):
    with pytest.raises(UrlRefused, match=words):
        check_url(url, GUARD)


def test_an_unresolvable_name_is_saved_with_a_warning():
    warning = check_url("https://not-yet.invalid/hooks", GUARD)
    assert warning.startswith("not-yet.invalid does not resolve now (")
    assert warning.endswith("saved, and checked by the egress guard again before each send")


def test_resolution_is_bounded():
    # a name IDNA cannot encode fails at once; the bound itself: no wait past it
    started = time.monotonic()
    warning = check_url("https://" + "a" * 64 + ".invalid/", GUARD, resolve_seconds=0.5)
    assert "does not resolve now" in warning
    assert time.monotonic() - started < 2


def test_a_public_address_passes_without_a_warning():
    assert check_url("https://93.184.215.14/hooks?token=abc", GUARD) == ""
    assert check_url("http://[2606:4700::1111]:8443/", GUARD) == ""


# --- every form of every internal address ------------------------------------------------

INTERNAL_V4 = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
INTERNAL_V4 += ["169.254.0.0/16", "100.64.0.0/10", "0.0.0.0/8"]


def _in(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address]:
    network = ipaddress.ip_network(cidr)
    first, size = int(network.network_address), network.num_addresses
    return st.integers(0, size - 1).map(lambda n: ipaddress.IPv4Address(first + n))


def _forms(address: ipaddress.IPv4Address) -> list[str]:
    """``address`` as a URL's host, in each form a resolver reads as it."""
    n = int(address)
    a, b, c, d = address.packed
    return [
        str(address),
        str(n),  # decimal
        hex(n),  # hex
        f"{a}.{(b << 16) | (c << 8) | d}",  # a.bcd
        f"{a}.{b}.{(c << 8) | d}",  # a.b.cd
        f"[::ffff:{address}]",  # IPv4-mapped
        f"[{ipaddress.IPv6Address(0x2002 << 112 | n << 80)}]",  # 6to4
        f"[{ipaddress.IPv6Address(0x64FF9B << 96 | n)}]",  # NAT64
    ]


@given(st.sampled_from(INTERNAL_V4).flatmap(_in), st.sampled_from(["http", "https"]))
def test_every_form_of_every_internal_address_is_refused(address, scheme):
    for host in _forms(address):
        with pytest.raises(UrlRefused, match="^refused by the egress guard: "):
            check_url(f"{scheme}://{host}:8080/hooks", GUARD)


@given(st.integers(1, 2**32 - 1).map(ipaddress.IPv4Address))
def test_a_public_address_passes_in_every_form_and_an_internal_one_is_refused(address):
    expected_refused = GUARD.refusal(address) is not None
    for host in _forms(address)[:6]:  # the forms that resolve to the address itself
        try:
            check_url(f"https://{host}/", GUARD)
            refused = False
        except UrlRefused:
            refused = True
        assert refused == expected_refused, host


@given(st.text(max_size=60))
def test_any_text_is_refused_or_passes_and_never_raises_anything_else(text):
    try:
        result = check_url(text, GUARD, resolve_seconds=0.5)
    except UrlRefused as refused:
        assert str(refused).startswith("refused by the egress guard: ")
    else:
        assert isinstance(result, str)
