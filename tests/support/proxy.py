"""A forwarding proxy on loopback, in a thread, for the outbox's crash tests.

It stands between the relay and a receiver built on this project: every request is
recorded and forwarded, and once the receiver has answered (its transaction committed),
a hook may act (kill or freeze the relay's worker, say) and choose the relay's answer:
the receiver's, another, or none at all, the connection dropped. That is "committed,
but the response was lost" on a real socket.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import httpx

from tests.support.receiver import QuietHandler, Received, Recording, loopback_server

# headers the relay signs or that name the delivery: forwarded as they came
FORWARDED = ("content-type", "user-agent", "idempotency-key")
FORWARDED_PREFIX = "webhook-"


@dataclass
class Forwarded:
    status: int
    body: bytes


# called with (request number from 0, the receiver's answer) once the receiver answered;
# returns the relay's answer, or None to drop its connection unanswered
AfterForward = Callable[[int, Forwarded], Forwarded | None]


@dataclass
class Proxy(Recording):
    url: str
    target: str
    after_forward: AfterForward | None = None
    answers: list[Forwarded] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            headers, body = self.read()
            with proxy.lock:
                number = len(proxy.received)
                proxy.received.append(Received(self.path, headers, body, time.monotonic()))
            forward = {
                k: v for k, v in headers.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIX)
            }
            response = httpx.post(proxy.target, content=body, headers=forward, timeout=30)
            answer = Forwarded(response.status_code, response.content)
            with proxy.lock:
                proxy.answers.append(answer)
            if proxy.after_forward is not None:
                answer = proxy.after_forward(number, answer)
            if answer is None:
                with proxy.lock:
                    proxy.dropped.append(number)
                # the receiver committed; the relay never hears of it
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(answer.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

    return Handler


@contextmanager
def forwarding_proxy(target: str, after_forward: AfterForward | None = None) -> Iterator[Proxy]:
    """A proxy to ``target`` on a free loopback port, for the block's duration."""
    with loopback_server() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
        proxy = Proxy(url=url, target=target, after_forward=after_forward)
        server.RequestHandlerClass = _handler(proxy)
        yield proxy


def first_answer_dropped(before: Callable[[], object] = lambda: None) -> AfterForward:
    """The first request's answer dropped, once ``before()`` has run: the receiver
    committed, and the relay never hears of it. Every later answer passes."""

    def after_forward(number: int, answer: Forwarded) -> Forwarded | None:
        if number == 0:
            before()
            return None
        return answer

    return after_forward
