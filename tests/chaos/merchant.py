"""The merchant: a real HTTP server (threads, in the orchestrator's process) that the
outbox delivers the shop's order moves to, and that misbehaves as merchants do.

Each request's signature is verified (Standard Webhooks, the destination's secret); then,
by chance, it answers 429 with ``Retry-After: 1`` or 500 before doing anything; else it
records the message's effect once per ``webhook-id`` (a redelivery is answered 200 and
counted as a duplicate), and now and then drops the connection without an answer after
the effect is recorded (the relay must send it again; the effect must stay single).
Effects keep their arrival order, so the order of an order's moves can be checked.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

from tests.bench.server import free_port

# the run's merchant as the outbox knows it (run.py adds it)
DESTINATION = "merchant"
EVENTS = "order.paid,order.cancelled,order.fulfilled"

P_429 = 0.04
P_500 = 0.04
P_DROP = 0.03
# the wait a 429 asks for
RETRY_AFTER_S = 1


class _Server(ThreadingHTTPServer):
    log = None

    def handle_error(self, request, client_address) -> None:
        # a relay that went away mid-answer (its worker killed): a line, not a traceback
        exc = sys.exc_info()[1]
        self.log.write(f"{time.time():.3f} {client_address}: {type(exc).__name__}: {exc}\n")


@dataclass
class Effect:
    key: str
    order_id: str
    status: str
    version: int
    at: float


@dataclass
class MerchantBook:
    """What the merchant saw; every field guarded by ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    effects: dict[str, Effect] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # keys in the order first applied
    answers: Counter = field(default_factory=Counter)  # 200, 429, 500, drop, 401, dup
    deliveries: Counter = field(default_factory=Counter)  # requests per key
    # when each key's first request arrived (its head read), whatever the answer: the
    # end of its admission-to-arrival latency
    arrivals: dict[str, float] = field(default_factory=dict)
    # when it answered 429, asking the relay to wait RETRY_AFTER_S
    deferred_at: list[float] = field(default_factory=list)
    in_flight: int = 0


class Merchant:
    def __init__(self, secret: str, log_path, seed: int = 11) -> None:
        self.webhook = Webhook(secret)
        self.book = MerchantBook()
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 (closed in stop)
        self.server = _Server(("127.0.0.1", self.port), self._handler())
        self.server.log = self.log
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
        self.log.close()

    def roll(self) -> float:
        with self.rng_lock:
            return self.rng.random()

    def _handler(self):
        merchant = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 (the base class's name)
                merchant.log.write(f"{time.time():.3f} {format % args}\n")

            def do_POST(self):
                book = merchant.book
                arrived, key = time.time(), self.headers.get("webhook-id")
                with book.lock:
                    book.in_flight += 1
                    if key:
                        book.arrivals.setdefault(key, arrived)
                try:
                    self._post(book)
                finally:
                    with book.lock:
                        book.in_flight -= 1

            def _answer(self, status: int, body: dict, headers=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _post(self, book: MerchantBook):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                time.sleep(merchant.roll() * 0.05)  # the merchant's own work
                try:
                    payload = merchant.webhook.verify(body, dict(self.headers.items()))
                except WebhookVerificationError as exc:
                    with book.lock:
                        book.answers["401"] += 1
                    merchant.log.write(
                        f"{time.time():.3f} 401 {self.headers.get('webhook-id')}: {exc} "
                        f"(body {len(body)} of {length} bytes)\n"
                    )
                    return self._answer(401, {"error": "bad signature"})
                key = self.headers["webhook-id"]
                roll = merchant.roll()
                with book.lock:
                    book.deliveries[key] += 1
                if roll < P_429:
                    with book.lock:
                        book.answers["429"] += 1
                        book.deferred_at.append(time.time())
                    retry_after = [("Retry-After", str(RETRY_AFTER_S))]
                    return self._answer(429, {"error": "slow down"}, retry_after)
                if roll < P_429 + P_500:
                    with book.lock:
                        book.answers["500"] += 1
                    return self._answer(500, {"error": "oops"})
                data = payload.get("data") or {}
                with book.lock:
                    duplicate = key in book.effects
                    if not duplicate:
                        book.effects[key] = Effect(
                            key, data.get("order_id", ""), data.get("status", ""),
                            int(data.get("version", -1)), time.time(),
                        )  # fmt: skip
                        book.order.append(key)
                    book.answers["duplicate" if duplicate else "applied"] += 1
                if merchant.roll() < P_DROP:  # committed, then the connection drops
                    with book.lock:
                        book.answers["dropped"] += 1
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return None
                return self._answer(200, {"ok": True, "duplicate": duplicate})

        return Handler
