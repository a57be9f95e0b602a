"""The sender: Standard-Webhooks-signed events spread over both nodes, as a shop that
posts to a load balancer would, with duplicates sent to both nodes at once.

Each order is a short story told in order by one sender thread: its stock reserved,
paid (v1), then fulfilled (v2), or cancelled (v2) and its stock released. Every
``duplicate_every``-th event goes to both nodes at the same moment under one
``webhook-id``; the others alternate between the nodes. A request that gets no answer
or a 5xx is sent again, re-signed under the same id, to the next node, with backoff, as
a sender retries, until it is answered 200 or 202 or its deadline passes.

What the shop should hold afterwards is computed from the plan (``Expected``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.bench.common import FULL_PATH, SHOP_SECRET

REQUEST_TIMEOUT_SECONDS = 10.0
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 1.0
SKUS = 11


def _key(secret: str) -> bytes:
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


_KEY = _key(SHOP_SECRET)


def wire(host: str, port: int, msg_id: str, body: bytes) -> bytes:
    """The whole request, signed now (a retry is signed again: a fresh timestamp)."""
    timestamp = int(time.time())
    mac = hmac.new(_KEY, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    head = (
        f"POST {FULL_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\nContent-Type: application/json\r\nwebhook-id: {msg_id}\r\n"
        f"webhook-timestamp: {timestamp}\r\n"
        f"webhook-signature: v1,{base64.b64encode(mac).decode()}\r\n\r\n"
    )
    return head.encode() + body


def post(host: str, port: int, msg_id: str, body: bytes) -> tuple[int, str]:
    """One attempt: (HTTP status, the answer's "status" or "error"); (0, why) if none."""
    try:
        with socket.create_connection((host, port), timeout=REQUEST_TIMEOUT_SECONDS) as sock:
            sock.sendall(wire(host, port, msg_id, body))
            chunks = []
            while chunk := sock.recv(65536):  # gunicorn closes after its answer
                chunks.append(chunk)
    except OSError as exc:
        return 0, type(exc).__name__
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        code = int(head[9:12])
    except ValueError:
        return 0, "no status line"
    try:
        answer = json.loads(payload)
        status = str(answer.get("status", answer.get("error", "")))
    except (ValueError, AttributeError):
        status = payload[:60].decode(errors="replace")
    return code, status


@dataclass(frozen=True)
class Event:
    msg_id: str
    body: bytes
    both: bool  # sent to both nodes at once


def _body(event_type: str, **data: object) -> bytes:
    return json.dumps({"type": event_type, "timestamp": int(time.time()), "data": data}).encode()


@dataclass
class Expected:
    receipts: int = 0
    ledger_rows: int = 0
    stock: Counter[str] = field(default_factory=Counter)
    orders: dict[str, tuple[str, int]] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # outbox key -> ordering key


def plan(tag: str, orders: int, duplicate_every: int) -> tuple[list[list[Event]], Expected]:
    """Each order's events, in the order they are told; and what they leave behind."""
    stories: list[list[Event]] = []
    expected = Expected()
    count = 0
    for i in range(orders):
        order = f"ord-{tag}-{i}"
        lines = [
            {"sku": f"sku-{i % SKUS}", "quantity": 1 + i % 3},
            {"sku": f"sku-{(i + 5) % SKUS}", "quantity": 2},
        ]
        cancelled = i % 3 == 0
        final = "cancelled" if cancelled else "fulfilled"
        bodies = [
            _body("inventory.reserved", order_id=order, version=1, lines=lines),
            _body("order.paid", order_id=order, version=1),
            _body(f"order.{final}", order_id=order, version=2),
        ]
        if cancelled:
            bodies.append(_body("inventory.released", order_id=order, version=2, lines=lines))
        story = []
        for step, body in enumerate(bodies):
            count += 1
            story.append(Event(f"{order}-{step}", body, both=count % duplicate_every == 0))
        stories.append(story)
        expected.receipts += len(bodies)
        for line in lines:
            expected.stock[line["sku"]] -= line["quantity"]
            expected.ledger_rows += 1
            if cancelled:
                expected.stock[line["sku"]] += line["quantity"]
                expected.ledger_rows += 1
        expected.orders[order] = (final, 2)
        for move, version in (("paid", 1), (final, 2)):
            expected.messages[f"order:{order}:{move}:v{version}"] = f"order:{order}"
    return stories, expected


@dataclass
class Attempt:
    at: float  # CLOCK_MONOTONIC when answered
    node: int
    code: int
    status: str
    seconds: float


@dataclass
class Sent:
    """Every attempt, and the events given up on (their deadline passed unanswered)."""

    attempts: list[Attempt] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def ok(self, attempt: Attempt) -> bool:
        return attempt.code in (200, 202)

    def failures(self) -> list[Attempt]:
        return [a for a in self.attempts if not self.ok(a)]

    def answers(self) -> Counter[str]:
        return self.answers_of(self.attempts)

    @staticmethod
    def answers_of(attempts: list[Attempt]) -> Counter[str]:
        return Counter(f"{a.code} {a.status}" for a in attempts)


class Sender:
    """Send the stories over ``nodes`` (host, port) with ``threads`` sender threads."""

    def __init__(self, nodes: list[tuple[str, int]], threads: int, deadline_s: float = 90.0):
        self.nodes = nodes
        self.threads = threads
        self.deadline_s = deadline_s
        self.sent = Sent()
        self._lock = threading.Lock()

    def run(self, stories: list[list[Event]]) -> Sent:
        todo: queue.SimpleQueue[tuple[int, list[Event]]] = queue.SimpleQueue()
        for n, story in enumerate(stories):
            todo.put((n, story))
        self.sent.started = time.monotonic()
        workers = [
            threading.Thread(target=self._loop, args=(todo,), daemon=True)
            for _ in range(self.threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=self.deadline_s + 2 * REQUEST_TIMEOUT_SECONDS)
        self.sent.ended = time.monotonic()
        return self.sent

    def _loop(self, todo: queue.SimpleQueue[tuple[int, list[Event]]]) -> None:
        while True:
            try:
                n, story = todo.get_nowait()
            except queue.Empty:
                return
            for step, event in enumerate(story):
                if event.both:  # a duplicate, to both nodes at the same moment
                    other = threading.Thread(target=self._deliver, args=(event, 1), daemon=True)
                    other.start()
                    self._deliver(event, 0)
                    other.join(timeout=self.deadline_s + REQUEST_TIMEOUT_SECONDS)
                else:
                    self._deliver(event, (n + step) % len(self.nodes))

    def _deliver(self, event: Event, node: int) -> None:
        """Until answered 200 or 202: a retry goes to the next node, after a backoff."""
        deadline = time.monotonic() + self.deadline_s
        wait = RETRY_FIRST_SECONDS
        while True:
            host, port = self.nodes[node]
            began = time.monotonic()
            code, status = post(host, port, event.msg_id, event.body)
            attempt = Attempt(time.monotonic(), node, code, status, time.monotonic() - began)
            with self._lock:
                self.sent.attempts.append(attempt)
            if self.sent.ok(attempt):
                return
            if time.monotonic() + wait > deadline:
                with self._lock:
                    self.sent.given_up.append(event.msg_id)
                return
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_SECONDS)
            node = (node + 1) % len(self.nodes)
