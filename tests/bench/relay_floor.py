"""The floor of the relay's scale bench: the least a correct sender does, in one plain
asyncio process with aiohttp and no database (``python -m tests.bench.relay_floor PLAN``).

PLAN is a JSON file: the limits (``rate``, ``burst``, ``in_flight``, ``timeout``,
``max_requests``) and the destinations, each its URL, its ``whsec_`` secret and its
messages (``[key, payload]``). Each message is sent once as the relay sends it: its
payload as compact JSON, signed at send time (Standard Webhooks: ``v1,`` + base64 of
HMAC-SHA256 of ``"<webhook-id>.<timestamp>.<body>"``), with the relay's headers, through
one ``ClientSession`` (``TCPConnector(limit=0)``, keep-alive), each request bounded by
``timeout``, its answer read. Each destination's limits are kept in memory: at most
``in_flight`` requests at once, a token bucket of ``rate`` a second with a burst of
``burst``; and at most ``max_requests`` at once for the process, as the relay's
RELAY_MAX_REQUESTS bounds its own.

Protocol with the bench, one line at a time: it prints ``ready`` once the plan is read
(the bench reads its CPU then), sends everything when it reads ``go``, prints one JSON
line (``{"sent", "errors", "seconds"}``) when the last answer is read, and exits when
its standard input closes or reads ``exit``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import sys
import time
from typing import Any

import aiohttp

from tests.bench.relay_merchants import raise_open_files

USER_AGENT = "webhook-receiver-relay"  # the relay's (transport.USER_AGENT)


def secret_key(secret: str) -> bytes:
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


def signed(key: bytes, message_key: str, payload: Any, timestamp: int) -> tuple[bytes, dict]:
    """The body and headers the relay sends for a message (transport.signed_request for a
    destination with one ``whsec_`` secret)."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    digest = hmac.new(key, f"{message_key}.{timestamp}.".encode() + body, hashlib.sha256)
    return body, {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "idempotency-key": message_key,
        "webhook-id": message_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest.digest()).decode(),
    }


class Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst``; starts full."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


class Floor:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.sent = 0
        self.errors = 0

    async def run(self) -> None:
        plan = self.plan
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session:
            room = asyncio.Semaphore(plan["max_requests"])
            await asyncio.gather(
                *(self.destination(session, room, dest) for dest in plan["destinations"])
            )

    async def destination(
        self, session: aiohttp.ClientSession, room: asyncio.Semaphore, dest: dict[str, Any]
    ) -> None:
        plan = self.plan
        key = secret_key(dest["secret"])
        slots = asyncio.Semaphore(plan["in_flight"])
        bucket = Bucket(plan["rate"], plan["burst"])
        sends = []
        for message_key, payload in dest["messages"]:
            await slots.acquire()
            await room.acquire()
            await bucket.take()
            sends.append(
                asyncio.create_task(
                    self.send(session, dest["url"], key, message_key, payload, slots, room)
                )
            )
        await asyncio.gather(*sends)

    async def send(
        self,
        session: aiohttp.ClientSession,
        url: str,
        key: bytes,
        message_key: str,
        payload: Any,
        slots: asyncio.Semaphore,
        room: asyncio.Semaphore,
    ) -> None:
        try:
            body, headers = signed(key, message_key, payload, int(time.time()))
            async with asyncio.timeout(self.plan["timeout"]):
                async with session.post(
                    url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    await response.read()
                    ok = response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            ok = False
        finally:
            slots.release()
            room.release()
        self.sent += 1
        self.errors += not ok


def main() -> None:
    raise_open_files()
    with open(sys.argv[1]) as file:
        plan = json.load(file)
    floor = Floor(plan)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    started = time.monotonic()
    asyncio.run(floor.run())
    seconds = time.monotonic() - started
    print(json.dumps({"sent": floor.sent, "errors": floor.errors, "seconds": seconds}), flush=True)
    sys.stdin.readline()  # "exit", or the pipe closed: the bench has read this process


if __name__ == "__main__":
    main()
