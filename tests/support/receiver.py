"""A real HTTP receiver on loopback, in a thread, for the relay's tests: it records every
request and answers from a script (status, headers, delay), then 200."""

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


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    # answers given in turn, then 200: (key or None for any, status, headers, delay)
    script: list[tuple[str | None, int, dict[str, str], float]] = field(default_factory=list)
    # called with each request's headers while the request is open (outside the lock)
    on_request: Callable[[dict[str, str]], None] | None = None
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

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

    def keys(self) -> list[str]:
        return [r.headers.get("webhook-id", "") for r in self.received]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with receiver.lock:
                receiver.in_flight += 1
                receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                headers = {k.lower(): v for k, v in self.headers.items()}
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

        def log_message(self, *args) -> None:
            pass

    return Handler


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    """A recording receiver on a loopback port of its own, in a thread."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), None)
    recv = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks")
    server.RequestHandlerClass = _handler(recv)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield recv
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as recv:
        yield recv
