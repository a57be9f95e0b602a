"""The sender: a process of its own that delivers a plan's events to the shop source as
an at-least-once sender does, and records every request it made.

Each delivery is resent until it gets a 2xx (or a 4xx, which is final), with
exponential backoff and jitter, honouring ``Retry-After`` up to a cap, and re-signed at
each attempt (a fresh ``webhook-timestamp``, the same ``webhook-id``). Copies of one
event go at once (concurrent duplicates); tampered and stale requests go once each.
Retries wait in a heap, not in a thread, so that an outage's backlog does not starve the
schedule. Every attempt is one line of ``requests.jsonl``: id, kind, start, end, status
and answer, or how it failed: ``refused`` (no connection: the server never saw it) or
``no_answer:<error>`` (sent, no answer: the server may have acted on it).

    python -m tests.chaos.sender --plan plan.json --url http://…/webhooks/shop/ \\
        --secret whsec_… --out requests.jsonl --deadline 600
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from standardwebhooks import Webhook

from tests.chaos.plan import EVIL_PREFIX, PlannedEvent, plan_load

REQUEST_TIMEOUT = 15.0
BACKOFF_BASE = 0.25
BACKOFF_CAP = 4.0
STALE_SECONDS = 3600


@dataclass
class Delivery:
    event: PlannedEvent
    kind: str  # real, tamper, stale
    copy: int = 0
    attempt: int = 0
    first_at: float = 0.0

    @property
    def msg_id(self) -> str:
        return f"stale_{self.event.msg_id}" if self.kind == "stale" else self.event.msg_id


class Sender:
    def __init__(self, url: str, secret: str, *, threads: int, retry_after_cap: float,
                 give_up: float) -> None:  # fmt: skip
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path
        self.webhook = Webhook(secret)
        self.threads = threads
        self.retry_after_cap = retry_after_cap
        self.give_up = give_up
        self.records: list[list] = []
        self.heap: list[tuple[float, int, Delivery]] = []
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(threads)
        self.seq = 0
        self.open = 0  # deliveries not finished
        self.gave_up: list[str] = []
        self.rng = random.Random(7)

    def push(self, due: float, delivery: Delivery) -> None:
        with self.lock:
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, delivery))

    def request(self, delivery: Delivery) -> tuple[bytes, dict[str, str]]:
        event, now = delivery.event, time.time()
        body = json.dumps({"type": event.type, "timestamp": int(now), **event.payload()})
        if delivery.kind == "stale":
            evil = event.payload(order_id=f"{EVIL_PREFIX}stale-{event.order_id}")
            body = json.dumps({"type": event.type, "timestamp": int(now), **evil})
            now -= STALE_SECONDS
        signature = self.webhook.sign(delivery.msg_id, datetime.fromtimestamp(now, UTC), body)
        if delivery.kind == "tamper":  # the original's signature over another body
            evil = event.payload(order_id=f"{EVIL_PREFIX}{event.order_id}", quantity_factor=100)
            body = json.dumps({"type": event.type, "timestamp": int(time.time()), **evil})
        headers = {
            "Content-Type": "application/json",
            "webhook-id": delivery.msg_id,
            "webhook-timestamp": str(int(now)),
            "webhook-signature": signature,
        }
        return body.encode(), headers

    def attempt(self, delivery: Delivery) -> None:
        try:
            self._attempt(delivery)
        finally:
            self.slots.release()

    def _attempt(self, delivery: Delivery) -> None:
        body, headers = self.request(delivery)
        delivery.attempt += 1
        t0 = time.time()
        status, answer, error, retry_after = None, "", "", None
        conn = http.client.HTTPConnection(self.host, self.port, timeout=REQUEST_TIMEOUT)
        try:
            try:
                conn.connect()
            except OSError as exc:
                error = f"refused:{type(exc).__name__}"
            else:
                try:
                    conn.request("POST", self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    raw = response.read()
                    status = response.status
                    retry_after = response.getheader("Retry-After")
                    try:
                        parsed = json.loads(raw)
                        answer = str(parsed.get("status") or parsed.get("error") or "")
                    except (ValueError, AttributeError):
                        answer = raw[:40].decode(errors="replace")
                except (OSError, http.client.HTTPException) as exc:
                    error = f"no_answer:{type(exc).__name__}"
        finally:
            conn.close()
        t1 = time.time()
        record = [delivery.msg_id, delivery.kind, delivery.copy, delivery.attempt, t0, t1]
        self.records.append(record + [status, answer, error])
        final = status is not None and (200 <= status < 300 or 400 <= status < 500)
        if delivery.kind != "real":
            final = final or status is None or status >= 500  # an attacker does not retry
        if final:
            self._done()
            return
        if t1 - delivery.first_at > self.give_up:
            self.gave_up.append(delivery.msg_id)
            self._done()
            return
        delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (delivery.attempt - 1))
        delay = self.rng.uniform(delay / 2, delay)
        if retry_after and retry_after.strip().isdigit():
            delay = max(delay, min(float(retry_after), self.retry_after_cap))
        self.push(t1 + delay, delivery)

    def _done(self) -> None:
        with self.lock:
            self.open -= 1

    def run(self, planned: list[PlannedEvent], deadline: float, log) -> None:
        start = time.time()
        for event in planned:
            kinds = ["real"] * event.copies + ["tamper"] * event.tamper + ["stale"] * event.stale
            for copy, kind in enumerate(kinds):
                self.push(start + event.at, Delivery(event, kind, copy, first_at=start + event.at))
                self.open += 1
        last_log = 0.0
        with ThreadPoolExecutor(self.threads) as pool:
            while time.time() < deadline:
                with self.lock:
                    if self.open == 0:
                        break
                    due = self.heap[0][0] if self.heap else None
                now = time.time()
                if now - last_log >= 5:
                    last_log = now
                    log(f"{now - start:6.1f}s requests={len(self.records)} open={self.open} "
                        f"waiting={len(self.heap)}")  # fmt: skip
                if due is None or due > now:
                    time.sleep(min(0.01 if due is None else due - now, 0.05))
                    continue
                if not self.slots.acquire(timeout=0.5):
                    continue
                with self.lock:
                    _, _, delivery = heapq.heappop(self.heap)
                if delivery.first_at > now + 1:  # not reached (clock): wait for it
                    delivery.first_at = now
                pool.submit(self.attempt, delivery)
            if self.open:
                log(f"deadline reached with {self.open} deliveries open")
            pool.shutdown(wait=True, cancel_futures=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=24)
    parser.add_argument("--deadline", type=float, default=600, help="seconds, at most")
    parser.add_argument("--retry-after-cap", type=float, default=5.0)
    parser.add_argument("--give-up", type=float, default=300.0)
    args = parser.parse_args()

    def log(line: str) -> None:
        print(f"{datetime.now(UTC):%H:%M:%S} sender: {line}", flush=True)

    planned = plan_load(__import__("pathlib").Path(args.plan))
    sender = Sender(args.url, args.secret, threads=args.threads,
                    retry_after_cap=args.retry_after_cap, give_up=args.give_up)  # fmt: skip
    log(f"{len(planned)} events to {args.url}")
    sender.run(planned, time.time() + args.deadline, log)
    with open(args.out, "w") as out:
        for record in sender.records:
            out.write(json.dumps(record) + "\n")
        out.write(json.dumps({"gave_up": sender.gave_up, "open": sender.open}) + "\n")
    log(f"done: {len(sender.records)} requests, {sender.open} open, {len(sender.gave_up)} gave up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
