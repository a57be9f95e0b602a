"""The egress guard: which addresses a request to an address someone typed may reach.

A destination's URL, an ``http`` reconciliation adapter's, a notifier's: each is text a
person entered, and the app POSTs there and keeps the answer. Pointed at an internal
service (the cloud's metadata address, a database's HTTP port, an admin on loopback),
that is server-side request forgery with a read path. So every address such a request
would connect to is checked here first, as resolved (a name that resolves to 127.0.0.1,
or changes its answer between a check and the send, is refused the same), and the
connection is made to the address checked, not to the name again.

Refused by default: loopback, private networks (RFC 1918, ULA), link-local (169.254/16,
with the cloud metadata address, and fe80::/10), unspecified, multicast, reserved and
documentation ranges, the shared address space (100.64/10), NAT64 (64:ff9b::/96,
64:ff9b:1::/48), site-local (fec0::/10), IPv6's reserved ::/8, 3fff::/20 and 5f00::/16
(which Python 3.11's ``is_global`` calls global), and every IPv6 form that embeds a
refused IPv4 address (IPv4-mapped, IPv4-translated, IPv4-compatible, 6to4, Teredo).
Decimal, hex and short IPv4 forms (``2130706433``, ``0x7f000001``, ``127.1``) are the
same addresses once resolved, and refused the same. Networks in the allow list
(``EgressGuard(allowed=…)``; ``configured_guard()`` reads ``EGRESS_ALLOWED_NETWORKS``)
are let through anyway, matched against the address connected to (an allowed IPv4
network admits none of its IPv6 wrappers): a development merchant on loopback, a
partner on a private link.

A refusal raises ``EgressRefused`` before any connection is made, so its text is the
same whether the refused address has an open port or not: no port scan through it. Its
text names the rule, never what a name resolves to (an internal DNS oracle for whoever
may edit a destination): that address goes to the server's log alone.

``check_url`` applies the same rules when a URL is saved (the destination form, ``manage.py
webhook_destination``), and refuses credentials in a URL and schemes other than http(s).

With an egress proxy (``EGRESS_PROXY``, ``egress_tunnel.py``) the app connects only to
the proxy, and names the destination to it by host name: the proxy resolves and
filters the name, and only an IP literal is still checked here, in every form a
resolver would read as one (``[::1%25lo]``, ``127.0.0.1.``, ``127.0.0.1%2e``).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ..conf import app_settings
from ..conf.egress_proxy import EgressProxy
from ..core import logs

logger = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(*cidrs: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# The rules in the order they are named; an address that none names but that is not
# globally routable (ipaddress's is_global) is refused as "not a public address".
RULES: tuple[tuple[str, tuple[Network, ...]], ...] = (
    ("loopback", _networks("127.0.0.0/8", "::1/128")),
    ("unspecified", _networks("0.0.0.0/8", "::/128")),
    ("private", _networks("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
    (
        "link-local (the cloud metadata address among them)",
        _networks("169.254.0.0/16", "fe80::/10"),
    ),
    ("shared address space (carrier-grade NAT)", _networks("100.64.0.0/10")),
    ("multicast", _networks("224.0.0.0/4", "ff00::/8")),
    ("NAT64", _networks("64:ff9b::/96", "64:ff9b:1::/48")),
    ("site-local (deprecated)", _networks("fec0::/10")),
    (
        "reserved",
        _networks(
            "192.0.0.0/24",
            "192.0.2.0/24",
            "198.18.0.0/15",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "240.0.0.0/4",
            # IPv6's own reserved block (IPv4-compatible and IPv4-translated forms among
            # it; an IPv4-mapped address is judged by its IPv4 address before this), the
            # discard prefix, documentation (2001:db8::/32, 3fff::/20) and SRv6's SIDs
            "::/8",
            "100::/64",
            "2001:db8::/32",
            "3fff::/20",
            "5f00::/16",
        ),
    ),
)


class EgressRefused(Exception):
    """A request to an address the egress guard refuses; no connection was made. Its
    text names the rule, and the address only when the host is that address: whoever
    can edit a destination must not learn what an internal name resolves to from the
    answer (the server's log has the address: ``EgressGuard.check``)."""

    def __init__(self, host: str, address: str, rule: str) -> None:
        self.host, self.address, self.rule = host, address, rule
        if _literal_host(host) == address:
            where = f"{address}, which is {rule}"
        elif literal_addresses(host):  # the address as written otherwise (127.1): no secret
            where = f"{host} resolves to {address}, which is {rule}"
        else:  # a name: what it resolves to stays in the server's log
            where = f"{host} resolves to an address that is {rule}"
        super().__init__(f"refused by the egress guard: {where}")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries: IPv4-mapped, IPv4-translated
    (``::ffff:0:a.b.c.d``), IPv4-compatible, 6to4, Teredo (its client). NAT64's prefixes
    are refused whole (their rule)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    packed = address.packed
    translated = packed[:8] == bytes(8) and packed[8:12] == b"\xff\xff\x00\x00"
    compatible = packed[:12] == bytes(12) and int(address) > 1  # ::a.b.c.d, not :: or ::1
    if translated or compatible:
        return ipaddress.IPv4Address(packed[12:])
    return None


@dataclass(frozen=True)
class EgressGuard:
    """The rules above, less the networks in ``allowed``."""

    allowed: tuple[Network, ...] = ()

    def refusal(self, address: Address) -> str | None:
        """Why ``address`` may not be reached, or None if it may. The allow list is
        matched against the address as connected to: an allowed IPv4 network admits
        none of the IPv6 forms that carry its addresses, which route elsewhere."""
        if any(address in network for network in self.allowed):
            return None
        return rule_of(address)

    def check(self, host: str, addresses: Sequence[Address]) -> None:
        """Raise EgressRefused if any of ``host``'s addresses is refused: a name with one
        public and one internal answer is not a name to trust with either. The refusal
        is logged with the address, which its text leaves out."""
        for address in addresses:
            rule = self.refusal(address)
            if rule is not None:
                logs.log_line(
                    logger,
                    logging.WARNING,
                    "egress guard: refused",
                    host=host,
                    address=str(address),
                    rule=rule,
                )
                raise EgressRefused(host, str(address), rule)

    def resolve(self, host: str, port: int) -> list[Address]:
        """``host``'s addresses for a TCP connection, each checked (EgressRefused), in the
        resolver's order. A name that does not resolve raises socket.gaierror (OSError),
        as a connection to it would."""
        addresses = resolve(host, port)
        self.check(host, addresses)
        return addresses


def rule_of(address: Address) -> str | None:
    """The rule that refuses ``address`` whatever the allow list, or None: an IPv6 form
    that carries an IPv4 address is judged by that address too (and refused by its own
    block where no public service uses it)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            why = rule_of(inner)
            if why is not None:
                return f"an IPv6 form of {inner}: {why}"
            if address.ipv4_mapped is not None:
                return None  # the connection is made to the IPv4 address itself
    for rule, networks in RULES:
        if any(address in network for network in networks):
            return rule
    return None if address.is_global else "not a public address"


def configured_guard() -> EgressGuard:
    """The guard, with ``WEBHOOK_RECEIVER['EGRESS_ALLOWED_NETWORKS']`` let through."""
    return EgressGuard(allowed=app_settings().egress_allowed_networks)


def configured_proxy() -> EgressProxy | None:
    """The egress proxy, ``WEBHOOK_RECEIVER['EGRESS_PROXY']``, or None."""
    return app_settings().egress_proxy


def literal_addresses(host: str) -> list[Address]:
    """The address ``host`` spells, if it is an IP literal in any form inet_aton reads
    (no lookup is made), once percent-decoded, without a zone (``[::1%25lo]``) and
    without a final dot (``127.0.0.1.``, ``127.0.0.1%2e``): each of these reaches the
    address through a proxy that resolves the name; [] for a name."""
    try:
        infos = socket.getaddrinfo(
            _literal_host(host), None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except (OSError, UnicodeError, ValueError):
        return []
    return _unique(infos)


def _literal_host(host: str) -> str:
    """``host`` as an address would be written: brackets, percent-encoding, a zone and
    final dots removed."""
    plain = unquote(host).strip("[]")
    return plain.split("%", 1)[0].rstrip(".")


def resolve(host: str, port: int) -> list[Address]:
    """``host`` as the system resolves it for TCP (an IP literal in any form inet_aton
    reads, ``127.1`` and ``2130706433`` among them, or a name), without duplicates."""
    literal = host.strip("[]")
    return _unique(socket.getaddrinfo(literal, port, type=socket.SOCK_STREAM))


def _unique(infos: Sequence[tuple[Any, ...]]) -> list[Address]:
    addresses: list[Address] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


# --- when a URL is saved --------------------------------------------------------------

SCHEMES = {"http": 80, "https": 443}


class UrlRefused(ValueError):
    """A URL the app will not send to, said when it is saved (its text names the rule)."""


def check_url(url: str, guard: EgressGuard | None = None, resolve_seconds: float = 3.0) -> str:
    """Check a URL as it is saved, so that whoever types it learns at once what the
    guard would refuse at every send. Raise UrlRefused for a scheme other than http(s),
    credentials in the URL, or a host with an address the guard refuses (``guard``, by
    default ``configured_guard()``). Return a warning ("" when there is none): a name
    that does not resolve within ``resolve_seconds`` is saved (a merchant's DNS may not
    exist yet), and is checked again before each send."""
    prefix = "refused by the egress guard: "
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError as exc:  # an unclosed [ or a bad IPv6 literal
        raise UrlRefused(f"{prefix}not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        what = f"not {scheme}:" if scheme else "and this URL names no scheme"
        raise UrlRefused(f"{prefix}only http and https URLs are sent to, {what}")
    if "@" in parts.netloc:
        raise UrlRefused(
            f"{prefix}credentials do not belong in the URL; put the secret in the secret field"
        )
    if not host:
        raise UrlRefused(f"{prefix}the URL names no host")
    guard = configured_guard() if guard is None else guard
    try:
        addresses = _resolve_within(host, SCHEMES[scheme], resolve_seconds)
    except OSError as exc:  # socket.gaierror, or TimeoutError
        return (
            f"{host} does not resolve now ({exc}): saved, and checked by the egress guard "
            "again before each send"
        )
    try:
        guard.check(host, addresses)
    except EgressRefused as refused:
        raise UrlRefused(str(refused)) from None
    return ""


def _resolve_within(host: str, port: int, seconds: float) -> list[Address]:
    """resolve(), given up after ``seconds`` (TimeoutError): getaddrinfo takes no
    timeout, so it runs in a daemon thread, left to finish on its own."""
    outcome: list[list[Address] | OSError] = []

    def run() -> None:
        try:
            outcome.append(resolve(host, port))
        except OSError as exc:
            outcome.append(exc)
        except UnicodeError as exc:  # a name IDNA cannot encode
            outcome.append(socket.gaierror(str(exc)))

    worker = threading.Thread(target=run, name="egress-resolve", daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:g} s")
    result = outcome[0]
    if isinstance(result, OSError):
        raise result
    return result
