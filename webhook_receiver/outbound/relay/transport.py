"""Sending: one signed request per claimed message, with no transaction open, each over
by the destination's timeout from connect to the last byte kept.

``deliver`` makes one attempt and says what came of it (``Sent``), whatever the peer
did: it signs the request, sends it through a ``Transport`` and keeps what may be
stored of the answer. ``PeerTransport`` is the relay's own: one aiohttp session per
relay process, whose connections go only to addresses the egress guard allows (a name
is resolved and each of its addresses checked before a connection is made to them;
an IP literal is checked as written), or, with ``EGRESS_PROXY``, only through a CONNECT
tunnel the proxy opens. The evaluation harness gives its own transport, whose merchants
answer in simulated time; every request goes through ``deliver`` either way.

Why aiohttp: measured on one machine in one run against the same merchants (200 ms
answers, 4 in flight each), aiohttp spent 0.22 to 0.29 ms of CPU a delivery from 100
to 1,000 merchants, httpx's AsyncClient 1.4 to 2.7 ms (docs/benchmarks.md).

Every deadline is one deadline: ``asyncio.timeout`` around connect, the request, the
status line and headers, and the excerpt of the body; a body that trickles past it ends
the excerpt with what came, the status line already read. Errors are named in one
vocabulary, whatever the library raised (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``RemoteProtocolError``, ``ProxyError``, …), so that an attempt's
error reads the same to an operator as it always has.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from django.utils import timezone
from yarl import URL

from ...conf.egress_proxy import EgressProxy
from ...core import storable, tracing
from ...core.egress import (
    EgressGuard,
    EgressRefused,
    configured_guard,
    configured_proxy,
    literal_addresses,
)
from ...core.egress_tunnel import (
    MAX_ANSWER_BYTES,
    EgressProxyRefused,
    authority,
    head_end,
    judge_answer,
    readable,
)
from ...core.peer_http import text_of
from ...schemes.standard import StandardWebhooks
from ..models import WebhookDestination
from .messages import EGRESS_GUARD, EGRESS_PROXY, EXCERPT_BYTES, EXCERPT_CHARS, Claimed, Sent

USER_AGENT = "webhook-receiver-relay"


@dataclass(frozen=True)
class Answer:
    """What is kept of an answer: its status, Retry-After, the charset it names and the
    first EXCERPT_BYTES of its body, as sent."""

    status: int
    retry_after: str | None = None
    charset: str | None = None
    body: bytes = b""


class NoAnswer(Exception):
    """A request that got no answer: ``kind`` names it (ConnectError, ReadTimeout, …)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Transport(Protocol):
    """Where requests go: the relay's ``PeerTransport``, or a harness's network."""

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, timeout: float
    ) -> Answer:
        """One POST, over by ``timeout`` seconds from its start to the last byte kept.
        Raises EgressRefused or EgressProxyRefused when no request may be made, and
        NoAnswer when one was made and no answer came."""

    async def close(self) -> None:
        """Its connections closed."""


# --- signing and one delivery ------------------------------------------------------------


def signed_request(
    dest: WebhookDestination, message: Claimed, timestamp: int
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt: the stable key as ``webhook-id`` and
    ``Idempotency-Key``, and a Standard Webhooks signature by each of the destination's
    secrets, ``v1`` by a ``whsec_`` secret and ``v1a`` by a ``whsk_`` signing key
    (space-separated, so a rotation verifies with either)."""
    body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()
    scheme = StandardWebhooks()
    signatures = [
        scheme.sign(secret=secret, body=body, message_id=message.key, timestamp=timestamp)
        for secret in dest.secrets
    ]
    headers = {
        "content-type": "application/json",
        # the excerpt is the answer's first bytes as sent: nothing to inflate
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "idempotency-key": message.key,
        "webhook-id": message.key,
        "webhook-timestamp": str(timestamp),
    }
    if signatures:
        headers["webhook-signature"] = " ".join(s["webhook-signature"] for s in signatures)
    return body, headers


async def deliver(
    transport: Transport,
    dest: WebhookDestination,
    message: Claimed,
    started_at: datetime | None = None,
) -> Sent:
    """One delivery, in a ``webhook.deliver`` span (with OpenTelemetry): a child of the
    span that admitted the message. ``started_at`` is the attempt's start as recorded:
    by default the moment its claim spent the token (``claimed_at``), whatever the
    loop's load made of the moments between. Never raises for the message."""
    with tracing.span(
        "webhook.deliver",
        kind=tracing.CLIENT,
        traceparent=message.traceparent,
        destination=dest.name,
        message_key=message.key,
        attempt=message.attempt,
    ) as span:
        at = started_at or message.claimed_at or timezone.now()
        sent = await _attempt(transport, dest, message, at)
        error = sent.error.split(":", 1)[0] if sent.error else None  # the class, no more
        tracing.annotate(span, status_code=sent.status_code, error=error)
        return sent


async def _attempt(
    transport: Transport, dest: WebhookDestination, message: Claimed, started_at: datetime
) -> Sent:
    # the loop's clock: the monotonic clock, or a harness's simulated one
    clock = asyncio.get_running_loop().time
    began = clock()
    body, headers = signed_request(dest, message, int(time.time()))
    tracing.inject(headers)  # the delivery's span goes on at the merchant's end

    def sent(**fields: Any) -> Sent:
        duration = round((clock() - began) * 1000)
        return Sent(message=message, started_at=started_at, duration_ms=duration, **fields)

    try:
        answer = await transport.post(dest.url, body, headers, timeout=dest.timeout_seconds)
    except (EgressRefused, EgressProxyRefused) as exc:  # no retry changes either
        return sent(
            error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS),
            refused_by=EGRESS_GUARD if isinstance(exc, EgressRefused) else EGRESS_PROXY,
        )
    except NoAnswer as exc:
        return sent(error=storable.text(f"{exc.kind}: {exc}", EXCERPT_CHARS))
    except Exception as exc:  # a transport's own failure: no answer all the same
        return sent(error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS))
    return sent(
        status_code=answer.status,
        excerpt=storable.text(text_of(answer.body, answer.charset), EXCERPT_CHARS),
        retry_after=answer.retry_after,
    )


# --- the relay's transport: aiohttp ------------------------------------------------------


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
            trace_configs=[_STAGES],
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
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._session.post(
                    target,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    trace_request_ctx=stage,
                )
        except TimeoutError:
            if stage.connected:
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
    """How far a request got: whether it has a connection (a timeout is then a
    ReadTimeout, else a ConnectTimeout)."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected = False


async def _connected(session: Any, context: Any, params: Any) -> None:
    stage = context.trace_request_ctx
    if isinstance(stage, _Stage):
        stage.connected = True


_STAGES = aiohttp.TraceConfig()
_STAGES.on_connection_create_end.append(_connected)
_STAGES.on_connection_reuseconn.append(_connected)
_STAGES.freeze()


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


def relay_send(dest: WebhookDestination, claimed: Iterable[Claimed]) -> list[Sent]:
    """Send each claimed message once, concurrently, through a transport of its own, and
    wait for every answer (for a step at a time: tests, tools). Never raises for a
    message; answers oldest first."""

    async def send_all() -> list[Sent]:
        transport = PeerTransport()
        try:
            return list(await asyncio.gather(*(deliver(transport, dest, m) for m in claimed)))
        finally:
            await transport.close()

    return sorted(asyncio.run(send_all()), key=lambda sent: sent.message.id)
