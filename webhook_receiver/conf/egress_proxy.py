"""``WEBHOOK_RECEIVER['EGRESS_PROXY']``: the HTTP proxy (smokescreen, a corporate proxy)
that every request to an address someone typed goes through, as a CONNECT tunnel.

Parsed once, into a value whose repr, str and every message name the proxy without its
credentials (masked.url_masked: ``http://***@host:port``): a password in the URL is only
ever sent, as Proxy-Authorization.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from .masked import url_masked


@dataclass(frozen=True)
class EgressProxy:
    """Where the proxy listens, and the Proxy-Authorization header for it, if any."""

    host: str
    port: int
    # the URL as every message shows it: masked.url_masked's, without the credentials
    shown: str
    # "Basic …", from user:password in the URL; never shown
    authorization: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        return f"EgressProxy({self.shown!r})"


def parse_egress_proxy(value: Any, where: str) -> EgressProxy | None:
    """None or "": no proxy. Otherwise ``http://[user:password@]host:port`` (the port
    is required: proxies have no usual one). A problem is ImproperlyConfigured, naming
    the setting as ``where``, whose text never repeats the URL (it may hold a password)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{where} must be a URL, http://host:port.")
    try:
        url = urlsplit(value.strip())
        port = url.port
    except ValueError:
        raise ImproperlyConfigured(f"{where} is not a URL (http://host:port).") from None
    if url.scheme != "http":
        raise ImproperlyConfigured(
            f"{where} must be an http:// URL (the app speaks to the proxy in plain HTTP, "
            f"and TLS to the destination inside its tunnel), not {url.scheme or 'no'} scheme."
        )
    if not url.hostname or port is None:
        raise ImproperlyConfigured(f"{where} must name a host and a port: http://host:port.")
    if url.path not in ("", "/") or url.query or url.fragment:
        raise ImproperlyConfigured(f"{where} must be only http://host:port, without a path.")
    authorization = None
    if url.username is not None or url.password is not None:
        pair = f"{unquote(url.username or '')}:{unquote(url.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return EgressProxy(
        host=url.hostname, port=port, shown=url_masked(value.strip()), authorization=authorization
    )
