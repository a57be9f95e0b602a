"""HTTP to peers we do not control (reconciliation's senders; the relay's answers are read
with its text_of):
one deadline per request, bodies read up to a cap, text decoded whatever charset the
peer names, and Retry-After read safely.

httpx's timeouts bound each network operation (a connect, one read, one write), not a
request (encode/httpx#1450): a peer that sends a header line every 4 s, or a body byte
every 2 s, never trips a 10 s read timeout, and holds the caller for as long as it
likes. Here the network backend under httpx's connection pool gives every operation
only the time left before the deadline of the request in progress on its thread
(``deadline()``), so that a request ends at its deadline, from connect to the last byte
kept, whatever the peer does. A read past the deadline raises httpx's own
``ReadTimeout`` (``ConnectTimeout``, ``WriteTimeout``), as a slow read would.

Clients made here (``client()``) never read proxies from the environment: an
environment proxy would get a transport of its own, without the deadline. The egress
proxy (``EGRESS_PROXY``) is a part of the same backend instead: its connect opens a
CONNECT tunnel through the proxy (``egress_tunnel.py``), within the same deadline.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

import httpcore
import httpx

from ..conf.egress_proxy import EgressProxy
from .egress import EgressGuard, literal_addresses
from .egress_tunnel import authority, open_tunnel

# the monotonic time by which the request in progress in this context must be over
_deadline: ContextVar[float | None] = ContextVar("peer_http_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every network operation of a client made here, in this block (connect, TLS, each
    read and write), ends ``seconds`` from now at the latest."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The operation's own timeout, or the time left before the deadline if shorter."""
    at = _deadline.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own blocking backend, each operation bounded by the deadline; with an
    egress ``guard``, a connection only to an address it allows, made to the address it
    checked (the name is not resolved again). With a ``proxy``, every connection is a
    tunnel through it: the proxy resolves and filters the name (the guard checks only an
    IP literal, which needs no lookup)."""

    def __init__(self, guard: EgressGuard | None = None, proxy: EgressProxy | None = None) -> None:
        self._backend = httpcore.SyncBackend()
        self._guard = guard
        self._proxy = proxy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self._proxy is not None:
            return self._tunnel(self._proxy, host, port, timeout, local_address, socket_options)
        left = _left(timeout, httpcore.ConnectTimeout)
        if self._guard is None:
            stream = self._backend.connect_tcp(host, port, left, local_address, socket_options)
            return _DeadlineStream(stream)
        # each checked address in the resolver's order, as a connection by name tries them
        failed: Exception = httpcore.ConnectError(f"{host} resolves to no address")
        for address in self._guard.resolve(host, port):
            left = _left(timeout, httpcore.ConnectTimeout)
            try:
                stream = self._backend.connect_tcp(
                    str(address), port, left, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                failed = exc
                continue
            return _DeadlineStream(stream)
        raise failed

    def _tunnel(
        self,
        proxy: EgressProxy,
        host: str,
        port: int,
        timeout: float | None,
        local_address: str | None,
        socket_options: Iterable[Any] | None,
    ) -> httpcore.NetworkStream:
        target = authority(host, port)
        literal = literal_addresses(host)
        if self._guard is not None and literal:
            self._guard.check(host, literal)
        started = time.monotonic()
        left = _left(timeout, httpcore.ConnectTimeout)
        try:
            raw = self._backend.connect_tcp(
                proxy.host, proxy.port, left, local_address, socket_options
            )
        except httpcore.ConnectTimeout as exc:
            raise httpcore.ConnectTimeout(f"the egress proxy {proxy}: {exc}") from exc
        except httpcore.ConnectError as exc:
            raise httpcore.ProxyError(f"no connection to the egress proxy {proxy}: {exc}") from exc
        stream = _DeadlineStream(raw)
        try:
            # the connect timeout covers the tunnel's opening too
            spent = time.monotonic() - started
            open_tunnel(stream, proxy, target, None if timeout is None else timeout - spent)
        except BaseException:
            stream.close()
            raise
        return stream

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport over a connection pool whose network backend keeps the
    deadline. HTTPTransport takes no network backend, so its pool is built here (as its
    own __init__ builds it) and its request handling, which maps httpcore's errors to
    httpx's, is kept as it is."""

    def __init__(
        self,
        *,
        limits: httpx.Limits,
        verify: Any = True,
        guard: EgressGuard | None = None,
        proxy: EgressProxy | None = None,
    ) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(guard, proxy),
        )


def client(
    *,
    timeout: httpx.Timeout | float,
    limits: httpx.Limits | None = None,
    headers: dict[str, str] | None = None,
    verify: Any = True,
    guard: EgressGuard | None = None,
    proxy: EgressProxy | None = None,
) -> httpx.Client:
    """An httpx client for a peer: every request it sends inside ``deadline()`` ends by
    then; redirects are not followed; with ``guard``, it connects only where the egress
    guard allows (``EgressRefused`` otherwise, before any connection); with ``proxy``
    (the egress proxy), only through a tunnel it opens (``EgressProxyRefused`` if it
    refuses the destination)."""
    limits = limits or httpx.Limits()
    return httpx.Client(
        transport=DeadlineTransport(limits=limits, verify=verify, guard=guard, proxy=proxy),
        timeout=timeout,
        headers=headers,
        follow_redirects=False,
        trust_env=False,
    )


# --- bodies ----------------------------------------------------------------------------


class TooLarge(Exception):
    """The answer's body is larger than the caller reads."""


def body_start(response: httpx.Response, *, max_bytes: int) -> bytes:
    """The first ``max_bytes`` of the body as sent (not decompressed: a small excerpt must
    not inflate), read until the deadline at most. A read that times out or breaks ends
    the excerpt: what came so far is kept, and the status line has been read already."""
    data = bytearray()
    try:
        for chunk in response.iter_raw():
            data += chunk
            if len(data) >= max_bytes:
                break
    except httpx.HTTPError:
        pass
    return bytes(data[:max_bytes])


def body_whole(response: httpx.Response, *, max_bytes: int) -> bytes:
    """The whole body (decoded as its Content-Encoding says), or ``TooLarge`` as soon as
    it is known to exceed ``max_bytes``; a read past the deadline raises httpx's timeout."""
    declared = response.headers.get("content-length", "")
    # more than 18 digits is over any limit, and not worth converting
    if (
        declared.isascii()
        and declared.isdigit()
        and (len(declared) > 18 or int(declared) > max_bytes)
    ):
        raise TooLarge(f"the answer declares {declared[:20]} bytes")
    data = bytearray()
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > max_bytes:
            raise TooLarge(f"the answer runs past {max_bytes} bytes")
    return bytes(data)


def charset_of(response: httpx.Response) -> str | None:
    """The charset the answer's Content-Type names, if it can be read."""
    try:
        return response.charset_encoding
    except (LookupError, ValueError, TypeError):
        return None


def text_of(data: bytes, charset: str | None) -> str:
    """``data`` as text, in the charset the peer named when that is a text encoding
    Python knows (not ``base64``, ``rot13``, or a name it made up), else UTF-8;
    undecodable bytes are replaced, never an error."""
    if charset:
        try:
            return data.decode(charset, errors="replace")
        except (LookupError, ValueError, TypeError):
            pass  # not a text encoding, or one that refuses these bytes whatever errors says
    return data.decode("utf-8", errors="replace")


# --- Retry-After -----------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: datetime, cap: float) -> float | None:
    """Retry-After as seconds (``120``) or an HTTP date, capped at ``cap``; None when
    absent or unreadable (``soon``, ``²``, a date without a zone)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value[:9])
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - now).total_seconds()
    return min(max(0.0, seconds), cap)
