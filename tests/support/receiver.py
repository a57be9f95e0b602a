"""A real HTTP receiver on loopback, in a thread, for the relay's tests: it records every
request and answers from a script (status, headers, delay), then 200. What it shares with
the forwarding proxy (tests/support/proxy.py): the record of requests, the quiet HTTP/1.1
handler, and the threaded server on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass(kw_only=True)
class Recording:
    """The requests a loopback server received, in order; ``lock`` guards them."""

    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keys(self) -> list[str]:
        return [r.headers.get("webhook-id", "") for r in self.received]


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (the relay keeps its connections), no access log on the test's output."""

    protocol_version = "HTTP/1.1"

    def read(self) -> tuple[dict[str, str], bytes]:
        """The request's headers (names in lower case) and its body."""
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        return {k.lower(): v for k, v in self.headers.items()}, body

    def log_message(self, *args) -> None:
        pass


@contextmanager
def loopback_server() -> Iterator[ThreadingHTTPServer]:
    """A threaded HTTP server on a free loopback port, serving for the block's duration.
    The caller sets its RequestHandlerClass (a handler that knows the URL, which names
    the port) before it hands the URL out, so before any request can come."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Receiver(Recording):
    url: str
    # answers given in turn, then 200: (key or None for any, status, headers, delay)
    script: list[tuple[str | None, int, dict[str, str], float]] = field(default_factory=list)
    # called with each request's headers while the request is open (outside the lock)
    on_request: Callable[[dict[str, str]], None] | None = None
    in_flight: int = 0
    most_in_flight: int = 0

    def answer(
        self,
        status: int,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        *,
        key: str | None = None,
    ) -> None:
        """Answer the next request (for ``key`` only, when given) with this."""
        self.script.append((key, status, headers or {}, delay))

    def _next_answer(self, key: str) -> tuple[int, dict[str, str], float]:
        for n, (wanted, status, headers, delay) in enumerate(self.script):
            if wanted in (None, key):
                del self.script[n]
                return status, headers, delay
        return 200, {}, 0.0


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            headers, body = self.read()
            with receiver.lock:
                receiver.in_flight += 1
                receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                receiver.received.append(Received(self.path, headers, body, time.monotonic()))
                status, headers, delay = receiver._next_answer(headers.get("webhook-id", ""))
            if receiver.on_request is not None:
                receiver.on_request(headers)
            time.sleep(delay)
            with receiver.lock:
                receiver.in_flight -= 1
            payload = b'{"ok": true}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A recording receiver on a loopback port of its own, in a thread."""
    with loopback_server() as server:
        recv = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks")
        server.RequestHandlerClass = _handler(recv)
        yield recv


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as recv:
        yield recv
