"""A CONNECT tunnel through the egress proxy (``WEBHOOK_RECEIVER['EGRESS_PROXY']``).

Every request to an address someone typed goes through it when one is configured, http
destinations too (the proxy sees, and may refuse, every request), and TLS to an https
destination is made inside the tunnel. The destination is named to the proxy by its
host name: the proxy resolves it and applies its own rules, and this app connects only
to the proxy, a configured and trusted address (usually an internal one, which the
egress guard would refuse; it is not checked). A destination given as an IP literal is
still checked by the guard here, as no lookup is needed for it.

The proxy's answer to CONNECT:

- 2xx: the tunnel is open;
- 403 or 407: the proxy refuses the destination (smokescreen answers 407 for a denied
  host), or the credentials: ``EgressProxyRefused``, which no retry changes;
- anything else (502, 504, a malformed answer, a proxy that closes or stays silent):
  a ``ProxyError`` or ``ConnectTimeout``, transient, retried like a network error.

The answer is read within the connect timeout and the request's deadline, and at most
``MAX_ANSWER_BYTES`` of it: a proxy that trickles, floods or never ends its headers
costs no more than a silent one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import httpcore
import httpx

from ..conf.egress_proxy import EgressProxy

MAX_ANSWER_BYTES = 8192
# how much of the proxy's reason phrase and body is kept in an error
DETAIL_CHARS = 200

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: (.*))?")
# what an authority httpx has parsed may hold; anything else is not sent to the proxy
_AUTHORITY_CHARS = re.compile(r"[A-Za-z0-9._~%:\[\]-]+")
REFUSING_STATUSES = frozenset({403, 407})


class EgressProxyRefused(httpx.ProxyError):
    """The egress proxy refused the tunnel (403 or 407): the destination is one it does
    not let through, or it refused our credentials. Terminal like a refusal by the
    egress guard: no retry changes it."""

    def __init__(self, proxy: EgressProxy, target: str, status: int, detail: str) -> None:
        self.proxy, self.target, self.status, self.detail = proxy, target, status, detail
        super().__init__(f"refused by the egress proxy {proxy}: CONNECT {target}: {detail}")


@dataclass(frozen=True)
class ConnectAnswer:
    status: int
    reason: str
    headers: dict[str, str]
    # bytes after the headers, read with them
    rest: bytes


def readable(data: bytes, limit: int = DETAIL_CHARS) -> str:
    """Peer bytes as one short line of printable text, for an error."""
    text = data.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()[:limit]


def head_end(data: bytes) -> int | None:
    """Where the answer's headers end (past the blank line), or None if not yet."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
    return min(ends) if ends else None


def parse_answer(data: bytes) -> ConnectAnswer:
    """The proxy's answer, from its first bytes through the blank line that ends its
    headers (and whatever came after). ValueError if it is not an HTTP/1 answer."""
    end = head_end(data)
    if end is None:
        raise ValueError("the answer's headers do not end")
    lines = data[:end].replace(b"\r\n", b"\n").split(b"\n")
    matched = _STATUS_LINE.fullmatch(lines[0])
    if matched is None:
        raise ValueError(f"not an HTTP status line: {readable(lines[0], 80)!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip():
            headers[readable(name, 80).lower()] = readable(value)
    reason = readable(matched.group(2) or b"")
    return ConnectAnswer(int(matched.group(1)), reason, headers, data[end:])


def authority(host: str, port: int) -> str:
    """``host:port`` as CONNECT names it (an IPv6 literal in brackets)."""
    if not _AUTHORITY_CHARS.fullmatch(host):
        raise httpcore.ConnectError(f"not a host name to send the egress proxy: {host!r}")
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def open_tunnel(
    stream: httpcore.NetworkStream,
    proxy: EgressProxy,
    target: str,
    timeout: float | None,
) -> None:
    """Ask the proxy on ``stream`` for a tunnel to ``target`` (``host:port``) and read its
    answer, within ``timeout`` seconds (the stream's own operations keep the request's
    deadline too). Returns once the tunnel is open; raises as the module says."""
    ends_at = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        if ends_at is None:
            return None
        remaining = ends_at - time.monotonic()
        if remaining <= 0:
            raise httpcore.ConnectTimeout(f"the egress proxy {proxy} did not answer in time")
        return remaining

    request = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if proxy.authorization:
        request.append(f"Proxy-Authorization: {proxy.authorization}")
    data = bytearray()
    try:
        stream.write(("\r\n".join(request) + "\r\n\r\n").encode("ascii"), left())
        while head_end(data) is None:
            if len(data) > MAX_ANSWER_BYTES:
                raise httpcore.ProxyError(
                    f"the egress proxy {proxy}'s answer to CONNECT {target} runs past "
                    f"{MAX_ANSWER_BYTES} bytes"
                )
            chunk = stream.read(MAX_ANSWER_BYTES + 1 - len(data), left())
            if not chunk:
                raise httpcore.ProxyError(
                    f"the egress proxy {proxy} closed the connection before answering "
                    f"CONNECT {target}"
                    + (f" (after {readable(bytes(data), 80)!r})" if data else "")
                )
            data += chunk
    except (httpcore.ReadTimeout, httpcore.WriteTimeout) as exc:
        raise httpcore.ConnectTimeout(
            f"the egress proxy {proxy} did not answer CONNECT {target} in time ({exc})"
        ) from exc
    except (httpcore.ReadError, httpcore.WriteError) as exc:
        raise httpcore.ProxyError(
            f"the egress proxy {proxy} broke the connection during CONNECT {target} ({exc})"
        ) from exc
    failure = judge_answer(proxy, target, bytes(data))
    if failure is not None:
        raise httpcore.ProxyError(failure)


def judge_answer(proxy: EgressProxy, target: str, data: bytes) -> str | None:
    """The proxy's answer to CONNECT, read whole (through its blank line): None when the
    tunnel is open, EgressProxyRefused when it refuses (403, 407), and otherwise what
    went wrong, in words (a transient failure, retried like a network error)."""
    try:
        answer = parse_answer(data)
    except ValueError as exc:
        return f"the egress proxy {proxy} answered CONNECT {target} with no HTTP answer: {exc}"
    said = f"HTTP {answer.status} {answer.reason}".strip()
    if 200 <= answer.status < 300:
        if answer.rest:  # the destination speaks only once asked: these came from the proxy
            return f"the egress proxy {proxy} sent bytes past its {said} to CONNECT {target}"
        return None
    if answer.status in REFUSING_STATUSES:
        length = answer.headers.get("content-length", "")
        body = answer.rest[: int(length)] if length.isdigit() and len(length) < 9 else answer.rest
        detail = f"{said}: {readable(body)}" if readable(body) else said
        raise EgressProxyRefused(proxy, target, answer.status, detail)
    return f"the egress proxy {proxy} answered CONNECT {target} with {said}"
