"""The relay's transport (``transport.Transport``): one aiohttp session for a relay
process. Keep-alive connections per merchant, one TLS context for all, no cookies, no
proxies from the environment, no redirects, no decompression.

Its connections go only to addresses the egress guard allows: a name is resolved and
each of its addresses checked before a connection is made to them (``_GuardedResolver``;
aiohttp connects to the addresses it resolved, not to the name again), an IP literal is
checked as written. With ``EGRESS_PROXY`` each connection is a CONNECT tunnel through the
proxy instead (``_PeerConnector``), named by the destination's host: the proxy resolves
and filters it, and sees every request, http ones too.

Why aiohttp: measured on one machine in one run against the same merchants (200 ms
answers, 4 in flight each), aiohttp spent 0.22 to 0.29 ms of CPU a delivery from 100
to 1,000 merchants, httpx's AsyncClient 1.4 to 2.7 ms (docs/benchmarks.md).

Every deadline is one deadline: ``asyncio.timeout_at`` around connect, the tunnel, the
request, the status line and headers, and the excerpt of the body; a body that trickles
past it ends the excerpt with what came, the status line already read.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from ...conf.egress_proxy import EgressProxy
from ...network.egress import (
    EgressGuard,
    EgressRefused,
    configured_guard,
    configured_proxy,
    literal_addresses,
)
from ...network.egress_tunnel import (
    MAX_ANSWER_BYTES,
    EgressProxyRefused,
    authority,
    head_end,
    judge_answer,
    readable,
)
from .messages import EXCERPT_BYTES
from .transport import Answer, NoAnswer


class PeerTransport:
    """One aiohttp session for a relay process: keep-alive connections per merchant,
    one TLS context for all, no cookies, no proxies from the environment, no redirects,
    no decompression. Made inside the process's event loop, and closed with it."""

    def __init__(
        self, *, guard: EgressGuard | None = None, proxy: EgressProxy | None = None
    ) -> None:
        self.guard = configured_guard() if guard is None else guard
        self.proxy = configured_proxy() if proxy is None else proxy
        connector = _PeerConnector(
            guard=self.guard,
            proxy=self.proxy,
            resolver=_GuardedResolver(self.guard),
            limit=0,  # the relay bounds its requests itself (engine.py)
            ttl_dns_cache=10,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, timeout: float
    ) -> Answer:
        deadline = asyncio.get_running_loop().time() + timeout
        target = _url(url)
        host = target.raw_host or ""
        # an IP literal is checked as written (no resolver sees it), through the proxy too
        self.guard.check(host, literal_addresses(host))
        stage = _Stage()
        staged = _STAGE.set(stage)
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._session.post(
                    target, data=body, headers=headers, allow_redirects=False
                )
        except TimeoutError:
            if stage.connected or not stage.connecting:  # a kept-alive connection, or one made
                kind, what = "ReadTimeout", "no answer"
            elif self.proxy is not None:
                kind, what = "ConnectTimeout", f"no tunnel from the egress proxy {self.proxy}"
            else:
                kind, what = "ConnectTimeout", "no connection"
            raise NoAnswer(
                kind, f"{what} within the destination's timeout ({timeout:g} s)"
            ) from None
        except (EgressRefused, EgressProxyRefused):
            raise
        except Exception as exc:
            raise _no_answer(exc) from None
        finally:
            _STAGE.reset(staged)
        async with response:
            data = await _excerpt(response, deadline)
            return Answer(
                status=response.status,
                retry_after=response.headers.get("retry-after"),
                charset=_charset(response),
                body=data,
            )

    async def close(self) -> None:
        await self._session.close()


class _Stage:
    """How far a request got: whether it opened a connection, and has it (a timeout
    while it opens one is a ConnectTimeout, else a ReadTimeout). Told by the connector
    (``_PeerConnector``) through ``_STAGE``, the request's own: aiohttp's tracing hooks
    would tell the same at 8% of the relay's CPU."""

    __slots__ = ("connecting", "connected")

    def __init__(self) -> None:
        self.connecting = False
        self.connected = False


# the stage of the request in progress in this task (each request is a task of its own)
_STAGE: contextvars.ContextVar[_Stage | None] = contextvars.ContextVar("stage", default=None)


def _url(url: str) -> URL:
    try:
        return URL(url)
    except (ValueError, TypeError) as exc:
        raise NoAnswer("InvalidURL", f"not a URL: {exc}") from None


async def _excerpt(response: aiohttp.ClientResponse, deadline: float) -> bytes:
    """The first EXCERPT_BYTES of the body as sent, read until the deadline at most: a
    read that times out or breaks ends the excerpt with what came so far."""
    data = bytearray()
    try:
        async with asyncio.timeout_at(deadline):
            while len(data) < EXCERPT_BYTES:
                chunk = await response.content.read(EXCERPT_BYTES - len(data))
                if not chunk:
                    break
                data += chunk
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        pass
    return bytes(data[:EXCERPT_BYTES])


def _charset(response: aiohttp.ClientResponse) -> str | None:
    """The charset the answer's Content-Type names, if it can be read."""
    try:
        return response.charset
    except (LookupError, ValueError, TypeError, AttributeError):
        return None


def _no_answer(exc: BaseException) -> NoAnswer:
    """An aiohttp error in the relay's own words (the attempt's error reads ``kind:
    detail``)."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, ProxyFailure):
        return NoAnswer("ProxyError", detail)
    if isinstance(exc, aiohttp.InvalidURL):
        return NoAnswer("InvalidURL", detail)
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return NoAnswer("ConnectError", detail)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return NoAnswer("RemoteProtocolError", f"the server closed the connection ({detail})")
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        return NoAnswer("RemoteProtocolError", detail)
    if isinstance(exc, aiohttp.ClientOSError | OSError):
        return NoAnswer("ReadError", detail)
    return NoAnswer(type(exc).__name__, detail)


class ProxyFailure(Exception):
    """The egress proxy could not open a tunnel (no answer, a malformed or failing one):
    transient, retried like a network error."""


class _GuardedResolver(AbstractResolver):
    """The system's resolver (in the loop's executor threads), every address of a name
    checked by the egress guard before any connection: a name with one public and one
    internal address is refused as a whole (EgressRefused, which aiohttp passes on)."""

    def __init__(self, guard: EgressGuard) -> None:
        self._guard = guard
        self._resolver = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        self._guard.check(host, _addresses(r["host"] for r in found))
        return found

    async def close(self) -> None:
        await self._resolver.close()


def _addresses(hosts: Iterable[str]) -> Sequence[Any]:
    return [ipaddress.ip_address(host.split("%", 1)[0]) for host in hosts]


class _PeerConnector(aiohttp.TCPConnector):
    """aiohttp's connector; with an egress proxy, each connection a CONNECT tunnel
    through it, named to the proxy by the destination's host (the proxy resolves and
    filters it), TLS to an https destination inside the tunnel. aiohttp itself tunnels
    only https through a proxy; every request goes through this one, http included, so
    that the proxy sees and may refuse each of them."""

    def __init__(self, *, guard: EgressGuard, proxy: EgressProxy | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._egress_proxy = proxy

    async def _create_direct_connection(
        self, req: Any, traces: Any, timeout: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, Any]:
        stage = _STAGE.get()
        if stage is not None:
            stage.connecting = True
        made = await self._connection_made(req, traces, timeout, **kwargs)
        if stage is not None:
            stage.connected = True
        return made

    async def _connection_made(
        self, req: Any, traces: Any, timeout: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, Any]:
        proxy = self._egress_proxy
        if proxy is None:
            return await super()._create_direct_connection(req, traces, timeout, **kwargs)
        host = req.url.raw_host or ""
        sock = await _tunnel(proxy, authority(host, req.port))
        sslcontext = self._get_ssl_context(req)
        try:
            return await self._loop.create_connection(
                self._factory,
                sock=sock,
                ssl=sslcontext,
                server_hostname=host.rstrip(".") if sslcontext else None,
            )
        except BaseException:
            sock.close()
            raise


async def _tunnel(proxy: EgressProxy, target: str) -> socket.socket:
    """A socket to the egress proxy with a tunnel to ``target`` open in it (the
    request's deadline bounds it). EgressProxyRefused when the proxy refuses the target
    or our credentials (403, 407); ProxyFailure otherwise."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProxyFailure(f"the egress proxy {proxy} does not resolve: {exc}") from None
    family, kind, protocol, _, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    sock.setblocking(False)
    try:
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            raise ProxyFailure(f"no connection to the egress proxy {proxy}: {exc}") from None
        request = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if proxy.authorization:
            request.append(f"Proxy-Authorization: {proxy.authorization}")
        await loop.sock_sendall(sock, ("\r\n".join(request) + "\r\n\r\n").encode("ascii"))
        data = bytearray()
        while head_end(bytes(data)) is None:
            if len(data) > MAX_ANSWER_BYTES:
                raise ProxyFailure(
                    f"the egress proxy {proxy}'s answer to CONNECT {target} runs past "
                    f"{MAX_ANSWER_BYTES} bytes"
                )
            chunk = await loop.sock_recv(sock, MAX_ANSWER_BYTES + 1 - len(data))
            if not chunk:
                seen = f" (after {readable(bytes(data), 80)!r})" if data else ""
                raise ProxyFailure(
                    f"the egress proxy {proxy} closed the connection before answering "
                    f"CONNECT {target}{seen}"
                )
            data += chunk
        failure = judge_answer(proxy, target, bytes(data))
        if failure is not None:
            raise ProxyFailure(failure)
        return sock
    except BaseException:
        sock.close()
        raise
